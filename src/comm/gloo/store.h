// Private: the rendezvous store of a Gloo process group, over Gloo's
// FileStore for "file:DIR" and a hiredis connection for "redis://HOST:PORT",
// with the two operations the join protocol needs and no blocking call
// without a deadline (a Redis call that gets no answer within `io_timeout`
// throws IoError; the next call connects again).
//
// Every key is prefixed with the job id, so jobs that share a store stay apart.
// Thread-safety: all methods may be called from any thread (one mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Store;
}

namespace lockstep::comm::gloo_backend {

class RedisClient;  // store.cpp

class RendezvousStore {
 public:
  // `address` is "file:DIR" (DIR must exist) or "redis://HOST:PORT". Throws
  // InvalidArgument for any other form, IoError if the store cannot be reached.
  RendezvousStore(const std::string& address, const std::string& job_id,
                  std::chrono::milliseconds io_timeout = std::chrono::seconds(10));
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // Sets `key` unless it exists. Returns false (and changes nothing) if it did.
  // Atomic across processes: of writers racing on one key exactly one sees true,
  // and readers see either nothing or that writer's whole value.
  bool set_if_absent(const std::string& key, const std::string& value);
  // The value of `key`, or nullopt if it is not set. Never blocks.
  std::optional<std::string> try_get(const std::string& key);
  // Deletes `key` (Gloo's stores have no delete: the file, or a redis DEL). Never throws.
  void remove(const std::string& key) noexcept;

  // True after a call failed for want of an answer in io_timeout (a stopped
  // or overloaded Redis server), until a call succeeds. Clean-up after a
  // failure skips the store then: each call would wait the whole timeout
  // again, on a connection made anew (a stopped server still accepts them).
  bool unresponsive() const { return unresponsive_; }

  bool is_redis() const { return redis_; }
  // For a redis store: its host and port (to find the interface that routes to it).
  const std::string& host() const { return host_; }
  int port() const { return port_; }
  const std::string& address() const { return address_; }
  const std::string& job_id() const { return job_id_; }
  std::chrono::milliseconds io_timeout() const { return io_timeout_; }

  // The group's session, once the join has completed: rank 0's claim nonce,
  // which every rank read. The group's abort reason lives under abort_key():
  // "abort" during the join, "abort/<session>" after it, a key no later job
  // reads (join.h, Note [Aborts do not outlive their job]).
  void set_session(const std::string& session) { session_ = session; }
  const std::string& session() const { return session_; }
  std::string abort_key() const { return session_.empty() ? "abort" : "abort/" + session_; }

 private:
  std::string key(const std::string& k) const { return job_id_ + "/" + k; }
  // The Redis connection, made again after one died (a command timed out).
  RedisClient& redis();

  std::string address_;
  std::string job_id_;
  bool redis_ = false;
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds io_timeout_;
  std::string session_;  // set by the owning thread before other threads use the store
  std::atomic<bool> unresponsive_{false};
  std::mutex mu_;                                   // guards store_ and redis_client_ (one connection)
  std::unique_ptr<gloo::rendezvous::Store> store_;  // a FileStore, for file:DIR
  std::unique_ptr<RedisClient> redis_client_;        // for redis://
};

}  // namespace lockstep::comm::gloo_backend
