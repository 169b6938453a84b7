#include "nn/data/fortunes.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/io.h"

namespace cf {
namespace data {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && is_ws(s[a])) ++a;
  while (b > a && is_ws(s[b - 1])) --b;
  return s.substr(a, b - a);
}

std::string trim_right(const std::string& s) {
  size_t b = s.size();
  while (b > 0 && is_ws(s[b - 1])) --b;
  return s.substr(0, b);
}

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// Plain entries of dir (names only), sorted byte-wise. IOError when dir cannot be listed.
std::vector<std::string> list_dir(const std::string& dir, const char* op) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    int err = errno;
    throw IOError(str("[", op, "] cannot open folder '", dir, "': ", std::strerror(err)));
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.empty() || n[0] == '.') continue;
    names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

void read_folder(const std::string& dir, const std::string& prefix,
                 std::set<std::pair<dev_t, ino_t>>& seen, std::vector<Fortune>& out, int& files) {
  struct Cand {
    std::string name;
    std::pair<dev_t, ino_t> id;
    bool link;
  };
  std::vector<Cand> cands;
  for (const std::string& name : list_dir(dir, "read_fortunes")) {
    if (ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    std::string path = dir + "/" + name;
    struct stat lst {}, st {};
    if (::lstat(path.c_str(), &lst) != 0 || ::stat(path.c_str(), &st) != 0) continue;  // dangling
    if (!S_ISREG(st.st_mode)) continue;  // folders (off/ is handled by the caller), devices
    cands.push_back({name, {st.st_dev, st.st_ino}, S_ISLNK(lst.st_mode)});
  }
  // One name per file: a real file's name wins over links to it, else the first link.
  std::set<std::pair<dev_t, ino_t>> real;
  for (const Cand& c : cands)
    if (!c.link) real.insert(c.id);
  for (const Cand& c : cands) {
    if (c.link && real.count(c.id)) continue;
    if (!seen.insert(c.id).second) continue;  // hard link, or a file read in another folder
    ++files;
    for (std::string& text : read_fortune_file(dir + "/" + c.name))
      out.push_back({prefix + c.name, std::move(text)});
  }
}

}  // namespace

std::vector<std::string> read_fortune_file(const std::string& path) {
  std::string data = io::read_file(path, "read_fortune_file");
  CF_CHECK(data.find('\0') == std::string::npos, IOError, "[read_fortune_file] '", path,
           "' holds NUL bytes: it is a binary file (a strfile .dat index?), not a fortune file");
  std::vector<std::string> entries;
  std::string cur;
  size_t pos = data.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;  // a UTF-8 byte-order mark is no text
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    size_t end = nl == std::string::npos ? data.size() : nl;
    std::string line = data.substr(pos, end - pos);
    pos = nl == std::string::npos ? data.size() : nl + 1;
    if (trim_right(line) == "%") {  // (as strfile: an indented '%' is a line of the entry, ASCII art say)
      std::string t = trim(cur);
      if (!t.empty()) entries.push_back(std::move(t));
      cur.clear();
    } else {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      cur += line;
      cur += '\n';
    }
  }
  std::string t = trim(cur);
  if (!t.empty()) entries.push_back(std::move(t));
  return entries;
}

std::vector<Fortune> read_fortunes(const std::string& dir, bool include_offensive) {
  std::set<std::pair<dev_t, ino_t>> seen;
  std::vector<Fortune> out;
  int files = 0;
  read_folder(dir, "", seen, out, files);
  if (include_offensive) {
    std::string off = dir + "/off";
    struct stat st {};
    CF_CHECK(::stat(off.c_str(), &st) == 0 && S_ISDIR(st.st_mode), IOError, "[read_fortunes] '",
             dir, "' has no off/ folder of offensive fortunes (Debian: fortunes-off)");
    read_folder(off, "off/", seen, out, files);
  }
  CF_CHECK(files > 0, IOError, "[read_fortunes] '", dir,
           "' holds no fortune files (Debian: apt-get install fortunes puts them in ",
           kFortunesDir, ")");
  return out;
}

}  // namespace data
}  // namespace cf
