// Writing a file so that nothing the user had is lost: the weights, reports,
// traces, profiles and plots of the library and the CLI go through here.
// (data::write_idx, which writes test fixtures, does not.)
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

namespace lockstep {

// Writes `pieces`, in order, to a new file with no name in the directory of
// `path` (O_TMPFILE), flushes it to disk, names it beside `path` (a unique
// name, so no other file is touched) and renames it over `path`. A reader
// never sees half a file, and a failed write leaves the old file as it was and
// no temporary behind, even if the process is killed while it writes. (Where
// the file system has no O_TMPFILE, or /proc is not mounted, the temporary is
// a named one, mkstemp, which such a kill leaves behind.) A file that existed keeps
// its mode (and its owner, where the process may set it); a new one gets
// 0666 less the umask. A symbolic link is followed (output_target), so the
// link stays and its target gets the new contents. The process's own stdout
// or stderr (/dev/stdout, or the file the shell redirected it to) is
// appended to, after flushing stdio; a device or FIFO is written through,
// not replaced, and a FIFO nobody reads fails at once; a socket is refused.
// Throws IoError "PATH: could not write WHAT (why)."
void write_file_atomically(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces,
                           std::string_view what);
// The file a write to `path` lands in: `path` with its symbolic links
// followed (to a target that need not exist yet). Throws IoError on a loop.
std::filesystem::path output_target(const std::filesystem::path& path);
// STDOUT_FILENO or STDERR_FILENO if `file` (a stat of the path) is that
// stream's file, else -1.
int standard_stream_of(const struct stat& file);
void write_file_atomically(const std::filesystem::path& path, std::string_view text, std::string_view what);

}  // namespace lockstep
