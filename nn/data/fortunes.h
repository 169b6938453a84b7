#pragma once
// Fortune files (the `fortune` program's databases; Debian package `fortunes`
// installs them in /usr/share/games/fortunes, the offensive ones from
// `fortunes-off` in its off/ subfolder).
//
// A file is one category (its name); entries are separated by lines holding a
// single '%' (a trailing '\r' or spaces are tolerated; a '%' after leading spaces is
// text, as strfile reads it). Each entry is trimmed of leading and trailing
// whitespace; empty entries are dropped. Line breaks inside an entry are kept ('\n').
// A leading UTF-8 byte-order mark is dropped; other bytes are passed through
// unchanged (the Debian files are UTF-8; a tokenizer repairs anything invalid).
#include <string>
#include <vector>

namespace cf {
namespace data {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct Fortune {
  std::string category;  // file name; "off/<name>" for offensive ones
  std::string text;
};

// Entries of one file. IOError naming the file when it cannot be read or holds NUL
// bytes (a binary file, e.g. a strfile .dat index).
std::vector<std::string> read_fortune_file(const std::string& path);

// Every fortune file in dir, in byte-wise sorted order of file names, entries in file
// order. Skipped: hidden files, strfile indexes (*.dat), *.u8 names (Debian's links
// to the same files), a symbolic or hard link to a file read under another name
// (the real file's name wins), and subfolders, except off/ when include_offensive is true
// (its files are read after the others, as "off/<name>"; rot13-encoded files, which
// upstream fortune-mod may install, are not decoded). IOError naming dir when it is
// missing or holds no fortune file.
std::vector<Fortune> read_fortunes(const std::string& dir = kFortunesDir,
                                   bool include_offensive = false);

}  // namespace data
}  // namespace cf
