// Writing a file so that nothing the user had is lost: the weights, reports,
// traces, profiles and plots of the library and the CLI go through here.
// (data::write_idx, which writes test fixtures, does not.)
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

namespace lockstep {

// Writes `pieces`, in order, to a new temporary file beside `path` (mkstemp:
// a unique name, so no other file is touched), with the mode a new file gets
// (0666 less the process's umask), flushes it to disk
// and renames it over `path`. A reader never sees half a file, and a failed
// write leaves the old file as it was and no temporary behind. Throws IoError
// "PATH: could not write WHAT (why)."
void write_file_atomically(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces,
                           std::string_view what);
void write_file_atomically(const std::filesystem::path& path, std::string_view text, std::string_view what);

}  // namespace lockstep
