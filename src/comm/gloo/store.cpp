// The rendezvous store: Gloo's FileStore and RedisStore behind set-if-absent
// and a non-blocking get (the stores' own waits only time out in whole
// seconds, so the join protocol polls with try_get against its own deadline).
// Redis's SETNX is atomic; for files, see ProbingFileStore.
#include "store.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>

#include "lockstep/error.h"

namespace lockstep::comm::gloo_backend {
namespace {

// Gloo's FileStore writes a key through a temporary file named after the key
// alone, so two processes setting the same key at once truncate each other's
// file and one of them renames an empty or torn value into place (seen as
// "n > 0" on read). Setting and reading are therefore done here: the value is
// written to a temporary file unique to this process and call, then hard-linked
// to the key's path, which fails with EEXIST if the key exists; the link makes
// a whole value appear at once. Only the key-to-path mapping is Gloo's.
class ProbingFileStore final : public gloo::rendezvous::FileStore {
 public:
  explicit ProbingFileStore(const std::string& dir)
      : FileStore(dir), tag_(std::to_string(::getpid()) + "." + std::to_string(std::random_device{}())) {}

  bool set_if_absent(const std::string& key, const std::string& value) {
    const std::string path = objectPath(key);
    const std::string tmp = path + ".tmp." + tag_ + "." + std::to_string(++writes_);
    write_file(tmp, value);
    const int rc = ::link(tmp.c_str(), path.c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) return true;
    if (err == EEXIST) return false;
    throw IoError("cannot create " + path + ": " + std::strerror(err) +
                  " (a file rendezvous needs a directory whose filesystem supports hard links)");
  }

  std::optional<std::string> try_read(const std::string& key) {
    const std::string path = objectPath(key);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::nullopt;
      throw IoError("cannot open " + path + ": " + std::strerror(errno));
    }
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw IoError("cannot read " + path + ": " + std::strerror(err));
      }
      if (n == 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return out;
  }

  void remove(const std::string& key) { ::unlink(objectPath(key).c_str()); }

 private:
  static void write_file(const std::string& path, const std::string& value) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw IoError("cannot create " + path + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < value.size()) {
      const ssize_t n = ::write(fd, value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(path.c_str());
        throw IoError("cannot write " + path + ": " + std::strerror(err));
      }
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }

  const std::string tag_;  // unique to this store: pid and a random number
  std::uint64_t writes_ = 0;
};

class ProbingRedisStore final : public gloo::rendezvous::RedisStore {
 public:
  using RedisStore::RedisStore;
  bool has(const std::string& key) { return check({key}); }
  // SETNX: true if this call created the key. Not Gloo's set(), which throws
  // on "already set" before it frees the reply (48 bytes leaked per lost race,
  // which LeakSanitizer reports).
  bool set_if_absent(const std::string& key, const std::string& value) {
    auto* reply = static_cast<redisReply*>(
        redisCommand(redis_, "SETNX %b %b", key.c_str(), key.size(), value.data(), value.size()));
    if (reply == nullptr) throw IoError(std::string("SETNX failed: ") + redis_->errstr);
    const bool integer = reply->type == REDIS_REPLY_INTEGER;
    const bool created = integer && reply->integer == 1;
    const std::string error = reply->type == REDIS_REPLY_ERROR && reply->str != nullptr ? reply->str : "";
    freeReplyObject(reply);
    if (!integer) throw IoError("SETNX failed: " + (error.empty() ? std::string("unexpected reply") : error));
    return created;
  }
  void remove(const std::string& key) {
    if (void* reply = redisCommand(redis_, "DEL %b", key.c_str(), key.size())) freeReplyObject(reply);
  }
};

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
  if (!redis_) {
    try {
      return static_cast<ProbingFileStore&>(*store_).set_if_absent(key(k), value);
    } catch (const IoError& e) {
      throw IoError("rendezvous " + address_ + ": " + e.what());
    }
  }
  auto& redis = static_cast<ProbingRedisStore&>(*store_);
  try {
    return redis.set_if_absent(key(k), value);
  } catch (const IoError& e) {
    throw IoError("rendezvous " + address_ + ": cannot set " + key(k) + ": " + e.what());
  } catch (const gloo::Exception& e) {
    throw IoError("rendezvous " + address_ + ": cannot set " + key(k) + ": " + e.what());
  }
}

std::optional<std::string> RendezvousStore::try_get(const std::string& k) {
  std::lock_guard lock(mu_);
  if (!redis_) {
    try {
      return static_cast<ProbingFileStore&>(*store_).try_read(key(k));
    } catch (const IoError& e) {
      throw IoError("rendezvous " + address_ + ": " + e.what());
    }
  }
  auto& redis = static_cast<ProbingRedisStore&>(*store_);
  try {
    if (!redis.has(key(k))) return std::nullopt;
    const std::vector<char> v = redis.get(key(k));
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
