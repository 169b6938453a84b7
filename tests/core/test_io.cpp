// core/io.h (issue 27, defects 5, 7, 8, 13, 14): non-blocking reads of regular
// files only, atomic writes that say why they failed, stale temporaries removed.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/io.h"
#include "core/serialization.h"
#include "nn/checkpoint.h"
#include "nn/config.h"
#include "nn/data/fortunes.h"
#include "nn/data/idx.h"
#include "nn/data/npy.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using cf::test::TempDir;
namespace fs = std::filesystem;

namespace {
// A pid that is certainly not running: a child that exited and was reaped.
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int status = 0;
  ::waitpid(p, &status, 0);
  return p;
}

void touch(const std::string& path) { std::ofstream(path) << "partial"; }
}  // namespace

TEST_CASE("defect 7: every reader refuses a FIFO at once instead of blocking in open()") {
  TempDir tmp;
  for (const char* name : {"run.safetensors", "x.npy", "x.idx", "f.txt", "c.ckpt"})
    REQUIRE(::mkfifo(tmp.file(name).c_str(), 0600) == 0);
  CHECK_THROWS_MSG(load_safetensors(tmp.file("run.safetensors")), IOError, "[load_safetensors]",
                   "run.safetensors", "is not a regular file (it is a FIFO)");
  CHECK_THROWS_MSG(nn::load_checkpoint(tmp.file("c.ckpt")), IOError, "c.ckpt", "(it is a FIFO)");
  CHECK_THROWS_MSG(data::read_npy(tmp.file("x.npy")), IOError, "[read_npy]", "x.npy", "(it is a FIFO)");
  CHECK_THROWS_MSG(data::read_idx(tmp.file("x.idx")), IOError, "[read_idx]", "x.idx", "(it is a FIFO)");
  CHECK_THROWS_MSG(data::read_fortune_file(tmp.file("f.txt")), IOError, "[read_fortune_file]", "f.txt",
                   "(it is a FIFO)");
  CHECK_THROWS_MSG(io::read_file(tmp.str(), "t"), IOError, "[t]", "(it is a directory)");
  CHECK_THROWS_MSG(io::read_file(tmp.file("none"), "t"), IOError, "[t] cannot open", "none", "no such file");
}

TEST_CASE("defect 13: a write removes the temporaries of its file left by dead processes") {
  TempDir tmp;
  const std::string path = tmp.file("m.safetensors");
  const std::string dead = tmp.file(".m.safetensors.tmp-" + std::to_string(dead_pid()) + "-3");
  const std::string live = tmp.file(".m.safetensors.tmp-" + std::to_string(::getpid()) + "-999");
  const std::string other = tmp.file(".n.safetensors.tmp-" + std::to_string(dead_pid()) + "-0");
  const std::string odd = tmp.file(".m.safetensors.tmp-notapid");
  for (const auto& p : {dead, live, other, odd}) touch(p);
  save_safetensors(path, {{"w", Tensor::ones({2})}});
  CHECK_FALSE(fs::exists(dead));  // its writer is gone: removed
  CHECK(fs::exists(live));        // a live writer (here this process) may still be writing
  CHECK(fs::exists(other));       // another file's temporary
  CHECK(fs::exists(odd));         // not a name cf makes
  CHECK(load_safetensors(path).tensors.size() == 1);
  CHECK(io::remove_stale_temps(tmp.file("n.safetensors")) == 1);
  CHECK_FALSE(fs::exists(other));
}

TEST_CASE("defect 14: a failed write says why, leaves no temporary and keeps the old file") {
  TempDir tmp;
  const std::string path = tmp.file("a.npy");
  data::save_npy(path, Tensor::zeros({4}));
  const std::string before = cf::test::read_bytes(path);
  // A file-size limit fails write() with EFBIG, as a full disk fails it with ENOSPC.
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1000;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  bool threw = false;
  std::string msg;
  try {
    data::save_npy(path, Tensor::zeros({10000}));
  } catch (const IOError& e) {
    threw = true;
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  CHECK(threw);
  CHECK_MESSAGE(msg.find("[save_npy] " + path + ": writing the temporary file") == 0, msg);
  CHECK_MESSAGE(msg.find(std::strerror(EFBIG)) != std::string::npos, msg);
  CHECK(tmp.count() == 1);
  CHECK(cf::test::read_bytes(path) == before);
  // A folder that does not exist: the reason is named too.
  CHECK_THROWS_MSG(io::write_file_atomic(tmp.file("no/x"), "x", "t"), IOError, "[t]",
                   "cannot create temporary file", "No such file or directory");
  CHECK_THROWS_MSG(io::write_file_atomic("", "x", "t"), IOError, "[t] the file name is empty");
}

TEST_CASE("atomic writes follow a symlink and refuse a FIFO, a device or a directory instead of replacing it") {
  // Before: the temporary was renamed over whatever the path named, so a FIFO (or --out /dev/null, as
  // root) became a plain file, and a symlink was replaced while its target stayed empty.
  TempDir tmp;
  const std::string target = tmp.file("target.txt"), link = tmp.file("link.txt");
  io::write_file_atomic(target, "old", "t");
  REQUIRE(::symlink("target.txt", link.c_str()) == 0);  // relative, as ln -s writes it
  io::write_file_atomic(link, "new", "t");
  struct stat st {};
  REQUIRE(::lstat(link.c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(cf::test::read_bytes(target) == "new");
  const std::string dangling = tmp.file("dangling.txt");  // a link to a file not yet written
  REQUIRE(::symlink("made.txt", dangling.c_str()) == 0);
  io::write_file_atomic(dangling, "made", "t");
  CHECK(cf::test::read_bytes(tmp.file("made.txt")) == "made");
  const std::string fifo = tmp.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const std::string fifo_msg = "[t] cannot write '" + fifo + "': it is a FIFO";
  CHECK_THROWS_MSG(io::write_file_atomic(fifo, "x", "t"), IOError, fifo_msg.c_str(), "not a regular file");
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK_THROWS_MSG(io::write_file_atomic("/dev/null", "x", "t"), IOError, "it is a character device");
  CHECK_THROWS_MSG(data::save_npy(tmp.str(), Tensor::zeros({2})), IOError, "[save_npy]", "it is a directory");
  // A cycle of links is an error (from a bug hunt: its end was renamed over, a plain file replacing the link)
  const std::string loop1 = tmp.file("loop1"), loop2 = tmp.file("loop2");
  REQUIRE(::symlink("loop2", loop1.c_str()) == 0);
  REQUIRE(::symlink("loop1", loop2.c_str()) == 0);
  CHECK_THROWS_MSG(io::write_file_atomic(loop1, "x", "t"), IOError, "[t] cannot write", "loop1",
                   "Too many levels of symbolic links");
  REQUIRE(::lstat(loop1.c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
}

TEST_CASE("atomic writes keep the permissions of the file they replace") {
  // The temporary was made 0644 and renamed over the target: a private checkpoint became world-readable
  // at its next save (from a bug hunt).
  TempDir tmp;
  const std::string path = tmp.file("private.bin");
  io::write_file_atomic(path, "one", "t");
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  io::write_file_atomic(path, "two", "t");
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(cf::test::read_bytes(path) == "two");
  REQUIRE(::chmod(path.c_str(), 0640) == 0);
  data::save_npy(path, Tensor::zeros({2}));
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0640);
}

TEST_CASE("defect 5: a checkpoint with NaN is refused at save (the old file stays) and at load - inf is kept") {
  TempDir tmp;
  const std::string path = tmp.file("diverged.ckpt");
  nn::TrainingCheckpoint good;
  good.model = {{"fc.weight", Tensor::zeros({2, 2})}, {"mask", test::t32({0.f, -INFINITY}, {2})}};
  nn::save_checkpoint(path, good);  // a -inf mask buffer is legitimate: it saves and loads
  CHECK(test::values(nn::load_checkpoint(path).model[1].second)[1] == -INFINITY);
  const std::string before = cf::test::read_bytes(path);
  nn::TrainingCheckpoint ck;
  ck.model = {{"fc.weight", test::t32({1.f, NAN, INFINITY, 2.f}, {2, 2})}, {"fc.bias", Tensor::zeros({2})}};
  CHECK_THROWS_MSG(nn::save_checkpoint(path, ck), ValueError, "[save_checkpoint]", "diverged.ckpt",
                   "'model.fc.weight' float32 (2,2)", "1 NaN value(s)", "nothing was written");
  CHECK(cf::test::read_bytes(path) == before);  // the last good checkpoint is intact
  ck.model = {{"fc.weight", Tensor::zeros({2, 2})}};
  ck.optimizer = {{"exp_avg", to(test::t32({NAN, 1.f}, {2}), kBFloat16)}};  // 16-bit dtypes too
  CHECK_THROWS_MSG(nn::save_checkpoint(path, ck), ValueError, "'optim.exp_avg' bfloat16 (2)", "1 NaN value(s)");
  // a file written by something else (or an older cf) with NaN is still refused at load
  save_safetensors(path, {{"model.w", test::t64({NAN}, {1})}}, {{"cf.format", "cf.checkpoint"}, {"cf.format_version", "1"}, {"step", "0"}, {"rng.count", "0"}});
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "[load_checkpoint]", "'model.w'", "1 NaN value(s)");
}

TEST_CASE("defect 15: a JSON number beyond double's range is an error naming the file") {
  TempDir tmp;
  const std::string path = tmp.file("huge.json");
  std::ofstream(path) << "{\"k\": 1e400}";
  CHECK_THROWS_MSG(nn::load_json_file(path), IOError, "[load_json_file]", "huge.json", "1e400");
}

TEST_CASE("fuzz_safetensors finding: a header number beyond double's range is an IOError naming the file") {
  TempDir tmp;
  const std::string path = tmp.file("big.safetensors");
  const std::string header = "{\"__metadata__\": {}, \"x\": 1e400}";
  std::string bytes(8, '\0');
  bytes[0] = char(header.size());
  std::ofstream(path, std::ios::binary) << bytes << header;
  CHECK_THROWS_MSG(load_safetensors(path), IOError, "[load_safetensors]", "big.safetensors",
                   "header is not valid JSON", "number overflow");
}
