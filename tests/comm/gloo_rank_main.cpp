// One rank of a Gloo process-group test: spawned N times by gloo_*_test.cpp
// (posix_spawn, never fork from the test), each with its own rank.
//
//   lockstep_gloo_rank --scenario S --rank R --world-size N --rendezvous file:DIR
//                      [--dir D] [--timeout-ms T] [--rendezvous-timeout-ms T]
//                      [--secret-file F] [--job-id J] [--iterations K]
//
// Scenarios: grid (--algorithm A: the all-reduce grid of A, or "others":
// every other collective, over the closed-form grid), allreduce (one
// checked all-reduce), hold (connect, mark D/connected.R, wait for D/go, one
// all-reduce), after (one all-reduce, mark D/reduced.R, wait for D/go, one
// more), loop (K all-reduces of 4 MiB, marking D/looping.R after the first),
// longest (the timeout set to Duration::max() after connect, then a ring and
// a native all-reduce that wait for a late rank).
// Exit codes: 0 ok, 1 wrong result, 2 InvalidArgument, 3 CommAborted,
// 4 TimeoutError, 5 another lockstep::Error, 6 anything else; the error goes
// to stderr.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "closed_form.h"
#include "lockstep/comm/bf16.h"
#include "lockstep/comm/collectives.h"
#include "lockstep/comm/process_group.h"
#include "lockstep/error.h"

namespace {

using namespace lockstep;
using namespace lockstep::comm;
namespace closed_form = lockstep::testing::closed_form;

struct Failed {
  std::string what;
};

void check(bool ok, const std::string& what) {
  if (!ok) throw Failed{what};
}

std::uint64_t digest(std::span<const float> v) {  // FNV-1a of the bytes
  std::uint64_t h = 14695981039346656037ull;
  for (std::byte b : std::as_bytes(v)) h = (h ^ std::uint64_t(b)) * 1099511628211ull;
  return h;
}

// Every rank holds the same bytes: rank 0's digests, broadcast once, against ours.
void check_identical(Communicator& comm, std::vector<std::uint64_t> mine,
                     const std::vector<std::string>& what) {
  std::vector<std::uint64_t> root = mine;
  broadcast(comm, std::as_writable_bytes(std::span<std::uint64_t>(root)), 0);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    check(mine[i] == root[i], what[i] + ": rank " + std::to_string(comm.rank()) + " differs from rank 0");
  }
}

// The digests of the results so far, checked across ranks by check_identical.
struct Digests {
  std::vector<std::uint64_t> values;
  std::vector<std::string> what;
};

void checked_allreduce(Communicator& comm, std::size_t count, ReduceOp op, Algorithm algorithm,
                       Digests* digests = nullptr) {
  const int n = comm.size();
  std::vector<float> data = closed_form::inputs(comm.rank(), count);
  allreduce(comm, data, {.op = op, .algorithm = algorithm});
  const std::string what = std::string("allreduce ") + to_string(algorithm) + " " + to_string(op) +
                           " n=" + std::to_string(n) + " count=" + std::to_string(count);
  for (std::size_t i = 0; i < count; ++i) {
    check(data[i] == closed_form::expected(op, n, i),
          what + " i=" + std::to_string(i) + ": got " + std::to_string(data[i]));
  }
  if (digests == nullptr) return check_identical(comm, {digest(data)}, {what});
  digests->values.push_back(digest(data));
  digests->what.push_back(what);
}

// The all-reduce grid of one algorithm: every count with every op; the
// largest (4 MiB, the same code path as 1000 elements) with Sum only, to keep
// N = 8 processes on two cores quick.
void allreduce_grid(Communicator& comm, Algorithm algorithm) {
  const int n = comm.size();
  const std::vector<std::size_t> counts = closed_form::allreduce_counts(n);
  Digests digests;
  for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min})
    for (std::size_t count : counts)
      if (count < (std::size_t{1} << 20) || op == ReduceOp::Sum)
        checked_allreduce(comm, count, op, algorithm, &digests);
  check_identical(comm, digests.values, digests.what);
}

// Reduce-scatter, all-gather, broadcast, barrier, and the bytes all-reduce sends.
void other_collectives(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  // Bytes on the wire, as the threads backend counts them (without the fingerprint's).
  for (auto algorithm : {Algorithm::Ring, Algorithm::Native}) {
    const std::size_t count = 24 * 1000;
    std::vector<float> data(count, 1.0f);
    const auto before = comm.stats().bytes_sent;
    allreduce(comm, data, {.op = ReduceOp::Sum, .algorithm = algorithm, .verify = false});
    const std::uint64_t p = count * sizeof(float);
    check(comm.stats().bytes_sent - before == 2 * p * (n - 1) / n,
          std::string("bytes sent by ") + to_string(algorithm));
  }

  // The bf16 ring (whose receives are posted a round ahead) over real
  // sockets: small integers, exact in bf16 at every partial sum, so the
  // closed form holds bit for bit; chunk sizes from empty to 12501.
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t(n - 1), std::size_t(n + 1),
                            std::size_t{1000}, std::size_t{100003}}) {
    std::vector<std::uint16_t> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = to_bf16(float(r + 1 + int(i % 3)));
    allreduce_bf16(comm, data, ReduceOp::Sum);
    for (std::size_t i = 0; i < count; ++i) {
      check(from_bf16(data[i]) == float(n * (n + 1) / 2 + n * int(i % 3)),
            "allreduce_bf16 count=" + std::to_string(count) + " i=" + std::to_string(i));
    }
  }

  for (std::size_t count : closed_form::reduce_scatter_counts(n)) {
    for (auto op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
      std::vector<float> in = closed_form::reduce_scatter_inputs(r, count);
      const std::size_t b = closed_form::chunk_begin(count, n, r), e = closed_form::chunk_end(count, n, r);
      std::vector<float> out(e - b);
      reduce_scatter(comm, in, out, op);
      for (std::size_t i = b; i < e; ++i) {
        check(out[i - b] == closed_form::reduce_scatter_expected(op, n, i),
              "reduce_scatter count=" + std::to_string(count) + " i=" + std::to_string(i));
      }
    }
  }
  for (std::size_t block : closed_form::all_gather_blocks()) {
    std::vector<float> in = closed_form::all_gather_inputs(r, block), out(block * n, -1.0f);
    all_gather(comm, in, out);
    for (std::size_t i = 0; i < out.size(); ++i)
      check(out[i] == closed_form::all_gather_expected(block, i), "all_gather");
  }
  for (int root = 0; root < n; ++root) {
    std::vector<float> data = closed_form::broadcast_inputs(r);
    broadcast(comm, std::span<float>(data), root);
    check(data == closed_form::broadcast_expected(root), "broadcast root " + std::to_string(root));
  }
  barrier(comm);
}

void mark(const std::string& dir, const std::string& name, int rank) {
  std::ofstream(dir + "/" + name + "." + std::to_string(rank)) << "1";
}

void wait_for_go(const std::string& dir) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::ifstream(dir + "/go")) {
    check(std::chrono::steady_clock::now() < give_up, "no go signal within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int run(std::map<std::string, std::string>& a) {
  ProcessGroupOptions o;
  o.rank = std::stoi(a["--rank"]);
  o.world_size = std::stoi(a["--world-size"]);
  o.rendezvous = a["--rendezvous"];
  o.timeout = std::chrono::milliseconds(std::stoi(a.count("--timeout-ms") ? a["--timeout-ms"] : "10000"));
  o.rendezvous_timeout = std::chrono::milliseconds(
      std::stoi(a.count("--rendezvous-timeout-ms") ? a["--rendezvous-timeout-ms"] : "30000"));
  if (a.count("--secret-file")) o.secret_file = a["--secret-file"];
  // --per-node G: pretend ranks r and s share a node when r / G == s / G, by
  // binding each node's ranks to their own loopback address (127.0.0.1 + r/G).
  const int per_node = a.count("--per-node") ? std::stoi(a["--per-node"]) : 0;
  if (per_node > 0) o.bind = "127.0.0." + std::to_string(1 + o.rank / per_node);
  if (a.count("--bind")) o.bind = a["--bind"];
  if (a.count("--job-id")) o.job_id = a["--job-id"];
  if (a.count("--build")) o.build = a["--build"];
  const std::string scenario = a["--scenario"], dir = a["--dir"];
  const int iterations = a.count("--iterations") ? std::stoi(a["--iterations"]) : 1000;

  auto comm = connect(Backend::Gloo, o);
  if (scenario == "grid") {  // --algorithm A: the all-reduce grid of A; "others": the other collectives
    const std::string algorithm = a["--algorithm"];
    if (per_node > 0) {  // the nodes the communicator reports are the ones we bound
      std::vector<int> want(static_cast<std::size_t>(o.world_size));
      for (int r = 0; r < o.world_size; ++r) want[static_cast<std::size_t>(r)] = r / per_node;
      check(comm->nodes() == want, "nodes() does not follow the bound addresses");
    }
    algorithm == "others" ? other_collectives(*comm)
                          : allreduce_grid(*comm, algorithm_from_string(algorithm));
  } else if (scenario == "allreduce") {
    checked_allreduce(*comm, 1000, ReduceOp::Sum, Algorithm::Ring);
  } else if (scenario == "longest") {  // Duration::max() after connect: Gloo's waits are held to 30 days
    comm->set_timeout(Duration::max());
    if (o.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others wait for it
    checked_allreduce(*comm, 1000, ReduceOp::Sum, Algorithm::Ring);
    if (o.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    checked_allreduce(*comm, 1000, ReduceOp::Sum, Algorithm::Native);
  } else if (scenario == "hold") {
    mark(dir, "connected", o.rank);
    wait_for_go(dir);
    checked_allreduce(*comm, 1000, ReduceOp::Sum, Algorithm::Ring);
  } else if (scenario == "after") {
    checked_allreduce(*comm, 1000, ReduceOp::Sum, Algorithm::Ring);
    mark(dir, "reduced", o.rank);
    wait_for_go(dir);
    checked_allreduce(*comm, 1000, ReduceOp::Sum, Algorithm::Ring);
  } else if (scenario == "loop") {
    mark(dir, "connected", o.rank);
    std::vector<float> data(std::size_t{1} << 20, 1.0f);
    for (int i = 0; i < iterations; ++i) {
      allreduce(*comm, data, {.op = ReduceOp::Mean});
      if (i == 0) mark(dir, "looping", o.rank);
    }
  } else if (scenario == "watch") {
    // Note [Watching for aborts]: rank 0 takes part in nothing (it sleeps
    // 4 s, past the test's bound, then leaves); rank 2 sends to rank 0 alone, so no
    // connection it waits on ever breaks; rank 1 aborts the group. Rank 2
    // must learn of it from the store, long before its own timeout.
    mark(dir, "connected", o.rank);
    wait_for_go(dir);
    if (o.rank == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(4));
    } else if (o.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 2 is waiting by now
      comm->abort("rank 1: stopped on purpose (watch test)");
      throw CommAborted("rank 1: communicator aborted: " + comm->abort_reason());
    } else {
      std::vector<float> data(1000, 1.0f);
      comm->isend(0, 7, std::as_bytes(std::span<const float>(data)))->wait(o.timeout);
    }
  } else if (scenario == "abort") {  // a job that fails after connecting: rank 1 aborts it
    if (o.rank == 1) {
      comm->abort("rank 1: failed on purpose (abort test)");
      throw CommAborted("rank 1: communicator aborted: " + comm->abort_reason());
    }
    checked_allreduce(*comm, 1000, ReduceOp::Sum, Algorithm::Ring);
  } else if (scenario == "time") {  // by hand: median time per all-reduce size, on stderr
    for (std::size_t count :
         {std::size_t{1}, std::size_t{1024}, std::size_t{1} << 18, std::size_t{1} << 20}) {
      std::vector<float> data(count, 1.0f);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) allreduce(*comm, data, {.op = ReduceOp::Sum});
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (o.rank == 0) std::cerr << count * 4 << " bytes: " << us / iterations << " us\n";
    }
  } else {
    throw InvalidArgument("unknown scenario " + scenario);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  const std::string who = "gloo_rank " + args["--rank"] + ": ";
  try {
    return run(args);
  } catch (const Failed& f) {
    std::cerr << who << "wrong result: " << f.what << "\n";
    return 1;
  } catch (const lockstep::InvalidArgument& e) {
    std::cerr << who << "InvalidArgument: " << e.what() << "\n";
    return 2;
  } catch (const lockstep::CommAborted& e) {
    std::cerr << who << "CommAborted: " << e.what() << "\n";
    return 3;
  } catch (const lockstep::TimeoutError& e) {
    std::cerr << who << "TimeoutError: " << e.what() << "\n";
    return 4;
  } catch (const lockstep::Error& e) {
    std::cerr << who << "Error: " << e.what() << "\n";
    return 5;
  } catch (const std::exception& e) {
    std::cerr << who << "exception: " << e.what() << "\n";
    return 6;
  }
}
