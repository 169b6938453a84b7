#pragma once
// The option table every app parses its command line and --config file with
// (DESIGN.md section 9): each option is declared once, with the field it sets,
// and is then accepted as "--max-len 128" / "--max-len=128" on the command line
// and as "max_len": 128 in the JSON config file. Unknown options and keys,
// missing values, mistyped values and values below a minimum are UsageErrors
// that name the option or key; the command line wins over the file.
//
// Each option also carries one help string: --help prints the app's own text
// and then this table, every default read from its field, so the list cannot
// drift from what is parsed.
//
//   cf::apps::Options opts("usage: cf-x [options]\n\nWhat cf-x does.\n");
//   opts.section("Training");
//   opts.add_int("steps", &cfg.steps, 1, "training steps");
//   opts.add_seeds(&cfg.seeds);
//   if (!opts.parse(argc, argv)) return 0;   // --help, printed
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cli.h"
#include "dist/dist.h"
#include "core/error.h"
#include "core/io.h"
#include "core/json.h"

namespace cf::apps {

// "a,b,c" -> {"a", "b", "c"}; "" -> {""}.
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

class Options {
 public:
  using json = nlohmann::ordered_json;

  // `intro` starts --help (usage line, what the app does); `outro` ends it
  // (exit statuses, notes), after the generated option list.
  explicit Options(std::string intro = "", std::string outro = "")
      : intro_(std::move(intro)), outro_(std::move(outro)) {}

  // Names are config keys ("max_len"); the command-line form swaps '_' for '-'.
  // A setter's `where` names the source of the value in its errors: "config key
  // 'max_len'" for the file, "--max-len" for the command line. `help` is the
  // option's line in --help, which appends "(default <the field's value>)".
  // max_value: the largest value that means something (a thread count, narrowed to int by OpenMP).
  void add_int(const std::string& key, int64_t* field, int64_t min_value, const std::string& help,
               int64_t max_value = std::numeric_limits<int64_t>::max()) {
    add(key, Kind::Int, help, [=] { return std::to_string(*field); },
        [=](const json& v, const std::string& where) {
          *field = need_int(where, v, min_value);
          if (*field > max_value)
            throw UsageError(where + " must be at most " + std::to_string(max_value) + ", got " +
                             std::to_string(*field));
        });
  }
  void add_number(const std::string& key, double* field, const std::string& help) {
    add(key, Kind::Number, help, [=] { return show_number(*field); },
        [=](const json& v, const std::string& where) { *field = need_number(where, v); });
  }
  // An empty default is not printed.
  void add_string(const std::string& key, std::string* field, const std::string& help) {
    add(key, Kind::String, help, [=] { return *field; }, [=](const json& v, const std::string& where) {
      if (!v.is_string()) throw UsageError(where + " must be a string");
      *field = v.get<std::string>();
    });
  }
  // Command line: true | false.
  void add_bool(const std::string& key, bool* field, const std::string& help) {
    add(key, Kind::Bool, help, [=] { return std::string(*field ? "true" : "false"); },
        [=](const json& v, const std::string& where) {
          if (!v.is_boolean()) throw UsageError(where + " must be true or false");
          *field = v.get<bool>();
        });
  }
  // Command line: a bare --name is true, --name=true|false either; config: true | false.
  void add_flag(const std::string& key, bool* field, const std::string& help) {
    add(key, Kind::Flag, help, [=] { return std::string(*field ? "true" : ""); },
        [=](const json& v, const std::string& where) {
          if (!v.is_boolean()) throw UsageError(where + " must be true or false");
          *field = v.get<bool>();
        });
  }
  // A second name of an option (cf-bench's --variant for --variants), on the command line and in config
  // files; giving both names is an error as giving one twice is.
  void add_alias(const std::string& alias, const std::string& key) {
    aliases_[alias] = key;
    help_order_.push_back(alias);
  }
  // Command line: "1,2,3" (an empty value is an empty list); config: [1, 2, 3]. distinct: a value given
  // twice is an error (a list of runs or table rows: a repeat ran twice and was averaged as another seed).
  void add_int_list(const std::string& key, std::vector<int64_t>* field, int64_t min_value,
                    const std::string& help, bool distinct = false) {
    add(key, Kind::IntList, help, [=] { return join(*field); }, [=](const json& v, const std::string& where) {
      std::vector<int64_t> out = need_int_list(where, v, min_value);
      if (distinct) refuse_repeats(where, out);
      *field = out;
    });
  }
  // Command line: "a,b"; config: ["a", "b"]. Never empty. distinct: an entry given twice is an error
  // (a list of things to run: a repeat would run, or print, the same thing twice).
  void add_string_list(const std::string& key, std::vector<std::string>* field, const std::string& help,
                       bool distinct = false) {
    add(key, Kind::StringList, help, [=] { return join(*field); }, [=](const json& v, const std::string& where) {
      const std::string what = where + " must be a non-empty array of strings";
      if (!v.is_array() || v.empty()) throw UsageError(what);
      std::vector<std::string> out;
      for (const json& x : v) {
        if (!x.is_string()) throw UsageError(what);
        const std::string e = x.get<std::string>();
        if (distinct && std::find(out.begin(), out.end(), e) != out.end())
          throw UsageError(where + " lists '" + e + "' twice");
        out.push_back(e);
      }
      *field = out;
    });
  }
  // --seed N (one seed) and --seeds LIST (several); giving both is an error.
  void add_seeds(std::vector<int64_t>* seeds, const std::string& what = "model initialisation and data order") {
    add("seed", Kind::Int, "one seed: " + what, [] { return std::string(); },
        [=](const json& v, const std::string& where) { *seeds = {need_int(where, v, 0)}; });
    add("seeds", Kind::IntList, "several seeds, one run each (not with --seed)", [=] { return join(*seeds); },
        [=](const json& v, const std::string& where) {
          std::vector<int64_t> s = need_int_list(where, v, 0);
          if (s.empty()) throw UsageError(where + " must list at least one seed");
          refuse_repeats(where, s);  // the same run twice, counted as two seeds in the means and spreads
          *seeds = s;
        });
  }
  // A heading in --help before the options added next.
  void section(const std::string& title) { help_order_.push_back("\n" + title + ":\n"); }

  // The --help text: intro, the options in the order they were added (with
  // their current values as defaults), --config and --help, outro.
  std::string usage() const {
    std::ostringstream out;
    out << intro_;
    if (!intro_.empty() && intro_.back() != '\n') out << "\n";
    out << "\nOptions (the command line wins over --config):\n" << table() << "\n"
        << help_line("--config FILE",
                     "JSON object with any of the options above, '-' as '_' (lists as arrays); unknown or "
                     "mistyped keys are errors")
        << help_line("-h, --help", "this text") << (outro_.empty() ? "" : "\n") << outro_;
    return out.str();
  }
  // The option lines alone, in the order they were added, under their sections.
  std::string table() const {
    std::string out;
    for (const std::string& entry : help_order_) {
      if (entry.rfind("\n", 0) == 0) {
        out += entry;
        continue;
      }
      if (aliases_.count(entry)) {
        out += help_line("--" + cli_name(entry) + metavar(options_.at(aliases_.at(entry)).kind),
                         "the same as --" + cli_name(aliases_.at(entry)));
        continue;
      }
      const Option& o = options_.at(entry);
      const std::string def = o.show();
      // "(default X)" stays on one line ('\1' is a space that help_line does not
      // break at); a help text that states its default in words gets none appended.
      const bool own_default = o.help.find("(default") != std::string::npos;
      const std::string text = def.empty() || own_default ? o.help : o.help + " (default\1" + def + ")";
      out += help_line("--" + cli_name(entry) + metavar(o.kind), text);
    }
    return out;
  }


  // Reads argv[first..]: prints usage() and returns false for -h/--help,
  // returns true once every option has been applied. Throws UsageError.
  bool parse(int argc, char** argv, int first = 1) {
    ArgReader args(argc, argv, first);
    json cli = json::object();
    std::map<std::string, std::string> given;  // key -> the spelling the command line gave it under
    std::string config_file;
    bool has_config = false;
    while (!args.done()) {
      const std::string opt = args.next();
      if (opt == "-h" || opt == "--help") {
        args.no_value(opt);
        std::cout << usage();  // before any value is applied: the defaults are the fields' own
        return false;
      }
      if (opt == "--config") {
        // One file: a second one silently replaced the first.
        if (has_config) throw UsageError("--config given twice ('" + config_file + "' and '" +
                                         args.value(opt) + "'); merge them into one file");
        config_file = args.value(opt);
        has_config = true;
        continue;
      }
      std::string name = opt.substr(2);  // the option's key as given ('-' and '_' alike), before aliases
      for (char& ch : name)
        if (ch == '-') ch = '_';
      const std::string key = aliases_.count(name) ? aliases_.at(name) : name;
      auto it = options_.find(key);
      if (it == options_.end()) throw UsageError("unknown option '" + opt + "'");
      // A repeated option takes its last value (scripts append overrides to a base command line), but an
      // option and its alias together are an error: the alias's value silently replaced the other's.
      if (given.count(key) && given.at(key) != "--" + cli_name(name))
        throw UsageError("--" + cli_name(name) + " and " + given.at(key) + " are the same option; give one of them");
      given[key] = "--" + cli_name(name);
      if (it->second.kind == Kind::Flag && !args.has_inline_value()) {
        cli[key] = true;
        continue;
      }
      const std::string s = args.value(opt);
      switch (it->second.kind) {
        case Kind::Int: cli[key] = parse_int(opt, s, std::numeric_limits<int64_t>::min()); break;
        case Kind::Number: cli[key] = parse_double(opt, s); break;
        case Kind::String: cli[key] = s; break;
        case Kind::Bool:
        case Kind::Flag:
          if (s != "true" && s != "false") throw UsageError(opt + " must be true or false, got '" + s + "'");
          cli[key] = s == "true";
          break;
        case Kind::IntList:
          cli[key] = s.empty() ? std::vector<int64_t>{}
                               : parse_int_list(opt, s, std::numeric_limits<int64_t>::min());
          break;
        case Kind::StringList: cli[key] = split_commas(s); break;
      }
    }
    if (cli.contains("seed") && cli.contains("seeds")) throw UsageError("give --seed or --seeds, not both");
    if (has_config) apply_file(config_file);
    for (auto& [k, v] : cli.items()) {
      options_.at(k).set(v, given.at(k));  // errors name the option as it was given (an alias too)
      set_keys_.insert(k);
    }
    return true;
  }

  // Whether the command line or a config file gave the option a value (else the field holds its default).
  bool given(const std::string& key) const { return set_keys_.count(key) > 0; }

  // Applies the keys of a JSON config file (an object).
  void apply_file(const std::string& path) {
    std::string text;
    try {
      text = cf::io::read_file(path, "config");  // regular files only: a FIFO is an error, not a hang
    } catch (const cf::IOError& e) {
      throw UsageError("cannot read config file '" + path + "': " + e.what());
    }
    json file;
    try {
      file = cf::io::parse_json(text);
    } catch (const cf::io::JsonStructureError& e) {
      throw UsageError("config file '" + path + "' is not valid: " + e.what());
    } catch (const json::exception& e) {
      // Any nlohmann error, not only parse_error: a number out of range ({"k": 1e400})
      // is an out_of_range exception, which escaped without the file's name.
      throw UsageError("config file '" + path + "' is not valid JSON: " + e.what());
    }
    if (!file.is_object()) throw UsageError("config file '" + path + "' must hold a JSON object");
    if (file.contains("seed") && file.contains("seeds"))
      throw UsageError("config file '" + path + "' sets both 'seed' and 'seeds'");
    std::map<std::string, std::string> named;  // option key -> the file's key for it (an alias or itself)
    for (auto& [k, v] : file.items()) {
      const std::string key = aliases_.count(k) ? aliases_.at(k) : k;
      auto it = options_.find(key);
      if (it == options_.end()) throw UsageError("unknown config key '" + k + "'");
      if (named.count(key))
        throw UsageError("config file '" + path + "' sets both '" + named.at(key) + "' and '" + k +
                         "' (the same option)");
      named[key] = k;
      it->second.set(v, "config key '" + k + "'");
      set_keys_.insert(key);
    }
  }

 private:
  enum class Kind { Int, Number, String, Bool, Flag, IntList, StringList };
  struct Option {
    Kind kind;
    std::string help;
    std::function<std::string()> show;  // the current value for --help; "" prints no default
    std::function<void(const json&, const std::string& where)> set;
  };
  std::map<std::string, Option> options_;
  std::map<std::string, std::string> aliases_;  // alias -> option key
  std::set<std::string> set_keys_;               // keys given a value by the command line or a config file
  std::vector<std::string> help_order_;  // option keys, and "\n<title>:" section headings
  std::string intro_, outro_;

  void add(const std::string& key, Kind kind, const std::string& help, std::function<std::string()> show,
           std::function<void(const json&, const std::string&)> set) {
    if (!options_.count(key)) help_order_.push_back(key);
    options_[key] = Option{kind, help, std::move(show), std::move(set)};
  }
  static std::string metavar(Kind kind) {
    switch (kind) {
      case Kind::Int: return " N";
      case Kind::Number: return " X";
      case Kind::String: return " S";
      case Kind::Bool: return " B";
      case Kind::Flag: return "";
      case Kind::IntList:
      case Kind::StringList: return " LIST";
    }
    return "";
  }
  // Shortest form that reads back as the same double: 0.001, 1e-05, 0.1.
  static std::string show_number(double x) {
    char buf[32];
    for (int precision = 6; precision <= 17; ++precision) {
      std::snprintf(buf, sizeof buf, "%.*g", precision, x);
      if (std::strtod(buf, nullptr) == x) break;
    }
    return buf;
  }
  template <class T>
  static std::string join(const std::vector<T>& items) {
    std::ostringstream out;
    for (size_t i = 0; i < items.size(); ++i) out << (i ? "," : "") << items[i];
    return out.str();
  }
  // "  --name N              text" with the text wrapped at 79 columns, indented 24.
  static std::string help_line(const std::string& name, const std::string& text) {
    constexpr size_t kIndent = 24, kWidth = 79;
    std::string out = "  " + name;
    out += out.size() + 2 <= kIndent ? std::string(kIndent - out.size(), ' ') : "\n" + std::string(kIndent, ' ');
    size_t col = kIndent;
    std::istringstream words(text);
    std::string word;
    bool first = true;
    while (words >> word) {
      if (!first && col + 1 + word.size() > kWidth) {
        out += "\n" + std::string(kIndent, ' ');
        col = kIndent;
      } else if (!first) {
        out += ' ';
        ++col;
      }
      for (char& ch : word)
        if (ch == '\1') ch = ' ';
      out += word;
      col += word.size();
      first = false;
    }
    return out + "\n";
  }
  // "max_len" -> "max-len"
  static std::string cli_name(std::string key) {
    for (char& ch : key)
      if (ch == '_') ch = '-';
    return key;
  }
  static int64_t need_int(const std::string& where, const json& v, int64_t min_value) {
    if (!v.is_number_integer()) throw UsageError(where + " must be an integer");
    // JSON keeps 2^63 and above as unsigned: read as int64 it wrapped to a negative number
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      throw UsageError(where + " is " + std::to_string(v.get<uint64_t>()) + ", beyond the int64 range");
    const int64_t x = v.get<int64_t>();
    if (x < min_value)
      throw UsageError(where + " must be at least " + std::to_string(min_value) + ", got " + std::to_string(x));
    return x;
  }
  static double need_number(const std::string& where, const json& v) {
    if (!v.is_number()) throw UsageError(where + " must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) throw UsageError(where + " must be finite");
    return x;
  }
  static void refuse_repeats(const std::string& where, const std::vector<int64_t>& values) {
    for (size_t i = 0; i < values.size(); ++i)
      if (std::find(values.begin(), values.begin() + long(i), values[i]) != values.begin() + long(i))
        throw UsageError(where + " lists " + std::to_string(values[i]) + " twice");
  }
  static std::vector<int64_t> need_int_list(const std::string& where, const json& v, int64_t min_value) {
    if (!v.is_array()) throw UsageError(where + " must be an array of integers");
    std::vector<int64_t> out;
    for (const json& x : v) {
      if (!x.is_number_integer()) throw UsageError(where + " must be an array of integers");
      // as need_int: 2^63 and above is kept unsigned and read as int64 wrapped to a negative number
      if (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX))
        throw UsageError(where + " holds " + std::to_string(x.get<uint64_t>()) + ", beyond the int64 range");
      const int64_t i = x.get<int64_t>();
      if (i < min_value)
        throw UsageError(where + ": every entry must be at least " + std::to_string(min_value) + ", got " +
                         std::to_string(i));
      out.push_back(i);
    }
    return out;
  }
};

// The start of every app's main(): runs `parse` (false for --help, which
// Options::parse has printed), or prints the error and a hint for a bad command
// line. Returns -1 when the app should go on, else its exit status (0 after
// --help, 2).
template <class Parse>
int parse_command_line(const std::string& app, Parse&& parse) {
  try {
    if (parse()) return -1;
    return 0;
  } catch (const UsageError& e) {
    // Under mpirun every rank parses the same command line: rank 0 alone says what is wrong (each rank
    // printed it), and a process group already started (a check that needs the world size) ends cleanly.
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr || std::atoi(rank) == 0)
      std::cerr << app << ": " << e.what() << "\n(run '" << app << " --help' for usage)\n";
    cf::dist::finalize();
    return 2;
  } catch (const std::exception& e) {
    // Anything else (a config file, starting the process group) may differ between ranks: every rank says it.
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    std::cerr << app << (rank ? std::string(" (rank ") + rank + ")" : std::string()) << ": " << e.what()
              << "\n(run '" << app << " --help' for usage)\n";
    return 2;
  }
}

// The rest of every app's main(): runs `body` (which returns the exit status);
// an exception becomes "<app>: <message>" on stderr and exit status 1, a
// TrainingStopped (--stop-after, train_run.h) exit status 3.
template <class Body>
int run_app(const std::string& app, Body&& body) {
  try {
    int rc = body();
    // The results are the app's stdout (JSON lines): a write that failed (a full disk, a closed pipe
    // reader) must not end with status 0, as if they had been delivered.
    std::cout.flush();
    if (!std::cout && rc == 0) {
      std::cerr << app << ": writing the results to stdout failed\n";
      rc = 1;
    }
    cf::dist::finalize();
    return rc;
  } catch (const TrainingStopped& e) {
    // Every rank stops at the same step (--stop-after): they finish together.
    if (cf::dist::rank() == 0) std::cerr << app << ": " << e.what() << "\n";
    cf::dist::finalize();
    return 3;
  } catch (const std::exception& e) {
    // --distributed: the other ranks may be waiting in a collective; end the job.
    if (cf::dist::is_initialized() && cf::dist::world_size() > 1)
      cf::dist::abort(1, app + " (rank " + std::to_string(cf::dist::rank()) + "): " + e.what());
    std::cerr << app << ": " << e.what() << "\n";
    return 1;
  }
}

// Every app's main(): parse_command_line(app, parse), then, unless that ended
// the program (--help, a bad command line), run_app(app, body).
template <class Parse, class Body>
int app_main(const std::string& app, Parse&& parse, Body&& body) {
  const int rc = parse_command_line(app, std::forward<Parse>(parse));
  return rc >= 0 ? rc : run_app(app, std::forward<Body>(body));
}

}  // namespace cf::apps
