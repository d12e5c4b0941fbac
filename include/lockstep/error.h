// The one error channel of lockstep: exceptions from a small hierarchy.
//
// The library never calls exit() or abort(); the command-line tool turns an
// Error into a one- or two-sentence message and a non-zero exit code.
#pragma once

#include <exception>
#include <span>
#include <stdexcept>
#include <string>

namespace lockstep {

// Base of every error lockstep throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A caller passed a value that can never work (bad flag, impossible size).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file is missing, unreadable, truncated or malformed.
class IoError : public Error {
 public:
  using Error::Error;
};

// A blocking call did not finish within its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The communicator was aborted (a replica failed, timed out, or mismatched).
// Every later call on it fails at once with this error.
class CommAborted : public Error {
 public:
  using Error::Error;
};

// Of the errors the threads of one group ended with (null: none), rethrows
// the first that is not a CommAborted, the consequence of another's failure,
// so that the cause is reported, not the group's abort; else the first
// CommAborted. Returns if there is none.
void rethrow_first_cause(std::span<const std::exception_ptr> errors);

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace lockstep

// Throws lockstep::Error naming file:line when `cond` is false. For internal
// invariants; user-facing validation throws InvalidArgument/IoError directly.
#define LOCKSTEP_CHECK(cond, msg)                                                           \
  do {                                                                                      \
    if (!(cond)) ::lockstep::detail::throw_check_failure(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// Throws lockstep::InvalidArgument(msg) when `cond` is false: a caller broke
// an API's contract (a call out of order, an index out of range). The message
// is built only when the check fails.
#define LOCKSTEP_REQUIRE(cond, msg)                               \
  do {                                                            \
    if (!(cond)) throw ::lockstep::InvalidArgument((msg));        \
  } while (0)
