#include "lockstep/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <system_error>

#include "lockstep/error.h"

namespace lockstep {
namespace {

// The umask, read without changing it (umask() sets it, for every thread):
// from /proc/self/status (Linux 4.7 and later), else the usual 022.
mode_t current_umask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  }
  return 022;
}

}  // namespace

std::filesystem::path output_target(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path target = path;
  std::error_code ec;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++hops) {
    if (hops == 40) {
      throw IoError(path.string() + ": too many levels of symbolic links; give the file itself.");
    }
    const fs::path to = fs::read_symlink(target, ec);
    if (ec) throw IoError(path.string() + ": cannot read the symbolic link: " + ec.message() + ".");
    target = to.is_absolute() ? to : target.parent_path() / to;
  }
  return target;
}

int standard_stream_of(const struct stat& file) {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat s {};
    if (::fstat(fd, &s) == 0 && s.st_dev == file.st_dev && s.st_ino == file.st_ino) return fd;
  }
  return -1;
}

namespace {

// Writes every piece to `fd`; 0 or the errno that stopped it.
int write_all(int fd, std::span<const std::span<const std::byte>> pieces) {
  for (const auto piece : pieces) {
    std::size_t done = 0;
    while (done < piece.size()) {
      const ssize_t n = ::write(fd, piece.data() + done, piece.size() - done);
      if (n > 0)
        done += std::size_t(n);
      else if (n == 0)
        return EIO;  // a full disk that says nothing
      else if (errno != EINTR)
        return errno;
    }
  }
  return 0;
}

// Gives the unnamed file `fd` (O_TMPFILE) a new name beside `target`,
// TARGET.tmp-XXXXXX, and returns it; "" if it cannot (no /proc to link from
// without privileges, or the file system refuses).
std::string name_beside(int fd, const std::filesystem::path& target) {
  const std::string from = "/proc/self/fd/" + std::to_string(fd);
  // A name unlikely to exist (one that does is tried again), from a source
  // that cannot throw (std::random_device may) and leak the descriptor.
  std::mt19937_64 entropy(static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                          (static_cast<std::uint64_t>(::getpid()) << 32) ^ static_cast<std::uint64_t>(fd));
  for (int attempt = 0; attempt < 100; ++attempt) {
    constexpr std::string_view kLetters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string name = target.string() + ".tmp-";
    for (int i = 0; i < 6; ++i) name += kLetters[entropy() % kLetters.size()];
    if (::linkat(AT_FDCWD, from.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) return name;
    if (errno != EEXIST) return "";
  }
  return "";
}

}  // namespace

void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::byte>> pieces, std::string_view what) {
  const auto fail = [&](const std::string& why) {
    throw IoError(path.string() + ": could not write " + std::string(what) + " (" + why + ").");
  };
  struct stat old {};
  // stat follows every link, /proc's magic ones too (/dev/stdout is
  // /proc/self/fd/1, whose link text may be "pipe:[1234]"): what is at the end?
  const bool found = ::stat(path.c_str(), &old) == 0;
  if (found && S_ISDIR(old.st_mode)) fail("it is a directory; give a file name");
  if (const int stream = found ? standard_stream_of(old) : -1; stream >= 0) {
    // Our own stdout or stderr (/dev/stdout, or the file the shell
    // redirected it to): appended to the stream, after what it already
    // holds. Renaming over the file would drop everything else written there.
    std::fflush(nullptr);
    if (const int err = write_all(stream, pieces); err != 0) fail(std::strerror(err));
    return;
  }
  if (found && S_ISSOCK(old.st_mode)) fail("it is a socket; give a file, a device or a pipe");
  if (found && !S_ISREG(old.st_mode)) {
    // A device or a FIFO (/dev/null, a pipe to a reader): written through,
    // since renaming over it would replace it. A FIFO with no reader fails at
    // once instead of blocking in open().
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
      fail(errno == ENXIO && S_ISFIFO(old.st_mode) ? "nothing is reading the pipe" : std::strerror(errno));
    int err = ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ? errno : 0;
    if (err == 0) err = write_all(fd, pieces);
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) fail(std::strerror(err));
    return;
  }
  // A regular file, or none yet: replaced by a rename in the directory it is
  // (or will be) in, at the end of any symbolic links, so a link stays a link.
  const std::filesystem::path target = output_target(path);
  const bool exists = ::stat(target.c_str(), &old) == 0;
  // mkstemp and O_TMPFILE create 0600: a file that existed keeps its mode
  // (and, where we may, its owner); a new one gets what a new file gets.
  const mode_t mode = exists ? old.st_mode & 07777 : 0666 & ~current_umask();
  const auto write_out = [&](int fd) {  // the bytes, mode and owner, on disk: 0 or an errno
    int err = write_all(fd, pieces);
    if (err == 0 && ::fchmod(fd, mode) != 0) err = errno;
    if (err == 0 && exists && (old.st_uid != ::geteuid() || old.st_gid != ::getegid())) {
      [[maybe_unused]] const int ignored =
          ::fchown(fd, old.st_uid, old.st_gid);  // root may; others keep theirs
    }
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    return err;
  };
  const auto close_and_replace = [&](int fd, const std::string& tmp) {
    std::error_code ec;
    if (::close(fd) != 0) ec = std::error_code(errno, std::generic_category());
    if (!ec) std::filesystem::rename(tmp, target, ec);
    if (ec) {
      std::filesystem::remove(tmp, ec);  // the target was not touched
      fail("cannot replace the file: " + ec.message());
    }
  };
  // Note [Nothing left by a killed writer]: the new contents go to a file
  // with no name (O_TMPFILE), which gets one beside the target only once it
  // is whole and on disk, for the moment until the rename. A process killed
  // while it writes (SIGKILL, out of memory, a file-size limit) leaves
  // nothing: the kernel frees an unnamed file with its last descriptor.
  // Where the file system has no O_TMPFILE, or /proc is not mounted to name
  // it, a named temporary (mkstemp) is written instead, which such a kill
  // leaves behind as FILE.tmp-XXXXXX (the old file is untouched either way).
  // Without /proc that is known before writing, so the bytes go out once.
  const bool can_name = ::access("/proc/self/fd", X_OK) == 0;
  const int unnamed = !can_name ? -1
                                : ::open(target.parent_path().empty() ? "." : target.parent_path().c_str(),
                                         O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (unnamed >= 0) {
    if (const int err = write_out(unnamed); err != 0) {
      ::close(unnamed);  // and the file is gone with it
      fail(std::strerror(err));
    }
    if (const std::string tmp = name_beside(unnamed, target); !tmp.empty()) {
      close_and_replace(unnamed, tmp);
      return;
    }
    ::close(unnamed);  // written, but no way to name it: the named way below
  }
  std::string tmp = target.string() + ".tmp-XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot create a temporary file beside it: ") + std::strerror(errno));
  if (const int err = write_out(fd); err != 0) {
    ::close(fd);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);  // the target was not touched
    fail(std::strerror(err));
  }
  close_and_replace(fd, tmp);
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text, std::string_view what) {
  const std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(text.data()), text.size());
  write_file_atomically(path, std::span(&piece, 1), what);
}

}  // namespace lockstep
