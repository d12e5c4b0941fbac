// A modelled interconnect for ranks that share one machine.
//
// In-process replicas exchange bytes at memory speed, which hides both the
// price of communication and how much of it overlaps with compute. A
// LinkModel gives every rank one outgoing link of a chosen bandwidth and
// latency; with_modelled_link() wraps the communicators of a group so that
// each message takes latency + bytes / bandwidth, as on a network. The model
// (serialised transfers per link, delivery times) is stated in
// modelled_link.cpp.
//
// Thread-safety: as for any Communicator (one thread per rank at a time); the
// wrappers of one group share their bookkeeping under a mutex of their own.
//
// Errors: parse_* throw InvalidArgument naming the bad text. A wait whose
// timeout ends before the modelled delivery fails with TimeoutError (and
// aborts the group); an abort wakes a modelled sleep within ~10 ms.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

struct LinkModel {
  double bytes_per_second = 0;          // 0 = unlimited
  std::chrono::nanoseconds latency{0};  // per message, after the last byte leaves

  // True when either is set; a default LinkModel adds no delay.
  bool enabled() const;
  // e.g. "10 Gbit/s, 50 us"; "no modelled delay" when disabled.
  std::string describe() const;
};

// Bytes per second from a rate with a unit: "10Gbit", "10Gbit/s", "10gbps",
// "100Mbit", "2.5GB/s", "500MB/s", "800KB/s", "1e9B/s". Bit units (bit,
// bit/s, bits, bps) are divided by 8; "B" is bytes; prefixes are decimal
// (K = 1e3, M = 1e6, G = 1e9, T = 1e12). Throws InvalidArgument naming the
// text for junk, a missing unit, zero, negative, inf or nan.
double parse_bandwidth(std::string_view text);

// A latency with a unit: "50us", "50µs", "1ms", "2s", "100ns", "0" (the only
// value that may omit its unit). Throws InvalidArgument naming the text for
// junk, a missing unit, negative, inf or nan.
std::chrono::nanoseconds parse_latency(std::string_view text);

// Wraps every communicator of one group (all ranks, in rank order) so that
// each message pays the modelled link. Returns the wrappers in the same
// order; they own the inner communicators. A disabled `link` returns `group`
// unchanged. The wrappers offer no native all-reduce, so collectives run
// their point-to-point algorithms and every byte pays the link; stats() are
// the inner communicators' (the bytes are unchanged). Throws InvalidArgument
// for a bad model or a group that is not all ranks in rank order; then
// `group` is left as it was (the communicators are still the caller's).
std::vector<std::unique_ptr<Communicator>> with_modelled_link(
    std::vector<std::unique_ptr<Communicator>>&& group, const LinkModel& link);

}  // namespace lockstep::comm
