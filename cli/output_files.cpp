#include "output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "lockstep/atomic_file.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

// The same file by any path, as write_file_atomically sees each: one inode
// if both exist, else where their links lead (output_target: a dangling link
// writes the file it names), normalised. A device other than this process's
// own stdout or stderr (/dev/null) is no one's file: two outputs there harm
// nothing. One stream (a pipe, stdout however it is connected) is: the
// outputs would run together.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    const bool device = (S_ISCHR(sa.st_mode) || S_ISBLK(sa.st_mode)) && standard_stream_of(sa) < 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && !device;
  }
  std::error_code ec;
  // Absolute first: weakly_canonical resolves only the part that exists, so
  // "./x" (whose "." exists) and "x" (nothing exists) would come out apart.
  return fs::weakly_canonical(fs::absolute(output_target(a)), ec) ==
         fs::weakly_canonical(fs::absolute(output_target(b)), ec);
}

// A stream, which both outputs would be appended to, not a file one replaces.
bool is_stream(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || standard_stream_of(st) >= 0);
}

void check_writable(const NamedFile& out) {
  // As write_file_atomically sees it: what is at the end of every link
  // (/proc's magic ones too), then, for a file, where it lands.
  struct stat st {};
  const bool found = ::stat(out.path.c_str(), &st) == 0;
  if (found && S_ISDIR(st.st_mode)) throw InvalidArgument(out.flag + " " + out.path + " is a directory; give a file name.");
  if (found && standard_stream_of(st) >= 0) {  // appended to the stream
    const int stream = standard_stream_of(st);
    const char* prefixed = std::getenv("LOCKSTEP_PREFIXED_STREAMS");  // set by lockstep launch
    if (prefixed != nullptr && std::strchr(prefixed, '0' + stream) != nullptr) {
      throw InvalidArgument(out.flag + " " + out.path + ": lockstep launch puts \"[rank N] \" before each line of " +
                            "this rank's standard " + (stream == 1 ? "output" : "error") +
                            ", so the output would not come out whole; give a file" +
                            (std::strchr(prefixed, '1') == nullptr ? ", or /dev/stdout (passed on as is)." : "."));
    }
    return;
  }
  if (found && S_ISSOCK(st.st_mode)) {
    throw InvalidArgument(out.flag + " " + out.path + " is a socket; give a file, a device or a pipe.");
  }
  if (found && !S_ISREG(st.st_mode)) {  // a device or a FIFO: written through
    if (::access(out.path.c_str(), W_OK) != 0) {
      throw InvalidArgument(out.flag + " " + out.path + " is not writable (" + std::strerror(errno) + ").");
    }
    return;
  }
  const fs::path target = output_target(out.path);
  const fs::path parent = fs::absolute(target).parent_path();
  const auto where = out.flag + " " + out.path + ": ";
  std::error_code ec;
  if (!fs::exists(parent, ec)) throw InvalidArgument(where + "the directory " + parent.string() + " does not exist.");
  if (!fs::is_directory(parent, ec)) {
    throw InvalidArgument(where + parent.string() + " is a file, not a directory; give a path in a directory.");
  }
  std::string probe = (parent / ".lockstep-write-check-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    throw InvalidArgument(where + "cannot write in the directory " + parent.string() + " (" +
                          std::strerror(errno) + ").");
  }
  ::close(fd);
  std::error_code ignored;  // a probe left behind is harmless; failing the run for it is not
  fs::remove(probe, ignored);
}

}  // namespace

void check_outputs(const std::vector<NamedFile>& outputs, const std::vector<NamedFile>& inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedFile& out = outputs[i];
    if (out.path.empty()) continue;
    check_writable(out);
    for (std::size_t j = 0; j < i; ++j) {
      if (!outputs[j].path.empty() && same_file(out.path, outputs[j].path)) {
        throw InvalidArgument(outputs[j].flag + " and " + out.flag + " both name " + out.path +
                              (is_stream(out.path) ? ", one stream, where the two would run together"
                                                   : ", and the second would overwrite the first") +
                              "; give each its own file.");
      }
    }
    for (const NamedFile& in : inputs) {
      if (!in.path.empty() && in.replaced_by != out.flag && same_file(out.path, in.path)) {
        throw InvalidArgument(out.flag + " " + out.path + " is " + in.flag + " (" + in.path +
                              "), which the run reads; writing it would destroy it. Give " + out.flag +
                              " another file.");
      }
    }
  }
}

bool takes_standard_output(const std::vector<NamedFile>& outputs) {
  for (const NamedFile& out : outputs) {
    struct stat st {};
    if (!out.path.empty() && ::stat(out.path.c_str(), &st) == 0 && standard_stream_of(st) == STDOUT_FILENO)
      return true;
  }
  return false;
}

}  // namespace lockstep::cli
