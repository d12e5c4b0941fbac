#include "lockstep/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
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

void write_file_atomically(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces,
                           std::string_view what) {
  std::string tmp = path.string() + ".tmp-XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  const auto fail = [&](const std::string& why) {
    throw IoError(path.string() + ": could not write " + std::string(what) + " (" + why + ").");
  };
  if (fd < 0) fail(std::string("cannot create a temporary file beside it: ") + std::strerror(errno));
  int err = 0;
  for (const auto piece : pieces) {
    std::size_t done = 0;
    while (done < piece.size() && err == 0) {
      const ssize_t n = ::write(fd, piece.data() + done, piece.size() - done);
      if (n > 0) done += std::size_t(n);
      else if (n == 0) err = EIO;  // a full disk that says nothing
      else if (errno != EINTR) err = errno;
    }
  }
  if (err == 0 && ::fchmod(fd, 0666 & ~current_umask()) != 0) err = errno;  // mkstemp creates 0600
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  std::error_code ec;
  if (err == 0) std::filesystem::rename(tmp, path, ec);
  if (err != 0 || ec) {
    const std::string why = err != 0 ? std::strerror(err) : "cannot replace the file: " + ec.message();
    std::filesystem::remove(tmp, ec);  // the target was not touched
    fail(why);
  }
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text, std::string_view what) {
  const std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(text.data()), text.size());
  write_file_atomically(path, std::span(&piece, 1), what);
}

}  // namespace lockstep
