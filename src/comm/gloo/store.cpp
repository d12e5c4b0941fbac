// The rendezvous store: Gloo's FileStore and RedisStore behind set-if-absent
// and a non-blocking get (the stores' own waits only time out in whole
// seconds, so the join protocol polls with try_get against its own deadline).
#include "store.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/error.h"

namespace lockstep::comm::gloo_backend {
namespace {

// FileStore keeps its non-blocking existence check protected; expose it.
class ProbingFileStore final : public gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool has(const std::string& key) { return check({key}); }
  void remove(const std::string& key) { ::unlink(objectPath(key).c_str()); }
};

class ProbingRedisStore final : public gloo::rendezvous::RedisStore {
 public:
  using RedisStore::RedisStore;
  bool has(const std::string& key) { return check({key}); }
  void remove(const std::string& key) {
    if (void* reply = redisCommand(redis_, "DEL %b", key.c_str(), key.size())) freeReplyObject(reply);
  }
};

bool has(gloo::rendezvous::Store& store, bool redis, const std::string& key) {
  return redis ? static_cast<ProbingRedisStore&>(store).has(key)
               : static_cast<ProbingFileStore&>(store).has(key);
}

void make_dirs(const std::string& dir) {
  for (std::size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      throw IoError("rendezvous file:" + dir + ": cannot create " + prefix + ": " + std::strerror(errno));
    }
  }
}

}  // namespace

RendezvousStore::RendezvousStore(const std::string& address, const std::string& job_id)
    : address_(address), job_id_(job_id) {
  if (job_id.empty() || job_id.find('/') != std::string::npos) {
    throw InvalidArgument("job id '" + job_id + "' must be non-empty and contain no '/'");
  }
  try {
    if (address.rfind("file:", 0) == 0 && address.size() > 5) {
      const std::string dir = address.substr(5);
      make_dirs(dir);
      store_ = std::make_unique<ProbingFileStore>(dir);
    } else if (address.rfind("redis://", 0) == 0) {
      const std::string rest = address.substr(8);
      const std::size_t colon = rest.rfind(':');
      char* end = nullptr;
      const long port = colon == std::string::npos ? 0 : std::strtol(rest.c_str() + colon + 1, &end, 10);
      if (colon == 0 || colon == std::string::npos || *end != '\0' || port <= 0 || port > 65535) {
        throw InvalidArgument("rendezvous '" + address + "': expected redis://HOST:PORT");
      }
      redis_ = true;
      host_ = rest.substr(0, colon);
      port_ = static_cast<int>(port);
      store_ = std::make_unique<ProbingRedisStore>(host_, port_);
    } else {
      throw InvalidArgument("rendezvous '" + address + "': expected file:DIR or redis://HOST:PORT");
    }
  } catch (const gloo::Exception& e) {
    throw IoError("rendezvous " + address + ": cannot open the store: " + e.what());
  } catch (const gloo::EnforceNotMet& e) {
    throw IoError("rendezvous " + address + ": cannot open the store: " + e.what());
  }
}

RendezvousStore::~RendezvousStore() = default;

bool RendezvousStore::set_if_absent(const std::string& k, const std::string& value) {
  std::lock_guard lock(mu_);
  try {
    if (has(*store_, redis_, key(k))) return false;
    store_->set(key(k), std::vector<char>(value.begin(), value.end()));
    return true;
  } catch (const gloo::EnforceNotMet&) {
    return false;  // "already exists" (file) / "already set" (redis SETNX)
  } catch (const gloo::Exception& e) {
    throw IoError("rendezvous " + address_ + ": cannot set " + key(k) + ": " + e.what());
  }
}

std::optional<std::string> RendezvousStore::try_get(const std::string& k) {
  std::lock_guard lock(mu_);
  try {
    if (!has(*store_, redis_, key(k))) return std::nullopt;
    const std::vector<char> v = store_->get(key(k));
    return std::string(v.begin(), v.end());
  } catch (const gloo::EnforceNotMet& e) {
    throw IoError("rendezvous " + address_ + ": cannot read " + key(k) + ": " + e.what());
  } catch (const gloo::Exception& e) {
    throw IoError("rendezvous " + address_ + ": cannot read " + key(k) + ": " + e.what());
  }
}

void RendezvousStore::remove(const std::string& k) noexcept {
  std::lock_guard lock(mu_);
  try {
    redis_ ? static_cast<ProbingRedisStore&>(*store_).remove(key(k))
           : static_cast<ProbingFileStore&>(*store_).remove(key(k));
  } catch (...) {  // best effort: a key left behind only matters to a later job with the same id
  }
}

}  // namespace lockstep::comm::gloo_backend
