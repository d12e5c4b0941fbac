// The rendezvous store: Gloo's FileStore, or a Redis connection through
// hiredis (RedisClient), behind set-if-absent and a non-blocking get (the
// join protocol polls with try_get against its own deadline). Redis's SETNX
// is atomic; for files, see ProbingFileStore.
#include "store.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/file_store.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>
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

// A Redis connection in which every call has a deadline: hiredis's connect
// with a timeout, then a socket timeout on each command. (Gloo's RedisStore
// has neither, so a server that accepted the connection but never answered,
// stopped or overloaded, blocked a rank forever.) After a timeout the
// connection is dead and every later call fails at once.
namespace {

constexpr const char* kNoAnswer = "did not answer within";  // RedisClient's timeout message

bool is_timeout(const IoError& e) { return std::string_view(e.what()).find(kNoAnswer) != std::string_view::npos; }

}  // namespace

class RedisClient {
 public:
  RedisClient(const std::string& host, int port, std::chrono::milliseconds timeout) : timeout_(timeout) {
    const timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    ctx_ = redisConnectWithTimeout(host.c_str(), port, tv);
    if (ctx_ == nullptr) throw IoError("cannot allocate a Redis connection");
    if (ctx_->err != 0) {
      const std::string why = ctx_->errstr;
      redisFree(ctx_);
      ctx_ = nullptr;
      throw IoError("cannot connect to the Redis server at " + host + ":" + std::to_string(port) + ": " + why);
    }
    redisSetTimeout(ctx_, tv);
  }
  ~RedisClient() {
    if (ctx_ != nullptr) redisFree(ctx_);
  }
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // SETNX: true if this call created the key.
  bool set_if_absent(const std::string& key, const std::string& value) {
    const Reply r = run({"SETNX", key, value});
    if (r->type != REDIS_REPLY_INTEGER) throw IoError("SETNX failed: " + error_of(r.get()));
    return r->integer == 1;
  }
  std::optional<std::string> get(const std::string& key) {
    const Reply r = run({"GET", key});
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    if (r->type != REDIS_REPLY_STRING) throw IoError("GET failed: " + error_of(r.get()));
    return std::string(r->str, r->len);
  }
  void remove(const std::string& key) { run({"DEL", key}); }

 private:
  struct FreeReply {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  using Reply = std::unique_ptr<redisReply, FreeReply>;

  Reply run(std::initializer_list<std::string_view> args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (reply != nullptr) return Reply(reply);
    const std::string why = ctx_->errstr;
    if (ctx_->err == REDIS_ERR_IO && (why.find("temporarily unavailable") != std::string::npos ||
                                      why.find("timed out") != std::string::npos)) {
      throw IoError(std::string("the Redis server ") + kNoAnswer + " " + std::to_string(timeout_.count()) +
                    " ms (stopped or overloaded?)");
    }
    if (ctx_->err == REDIS_ERR_PROTOCOL) {  // e.g. an HTTP server answering with "<html>"
      throw IoError("the server did not answer in the Redis protocol (" + why +
                    "); is a Redis server listening at that address?");
    }
    throw IoError(why.empty() ? std::string("the Redis connection failed") : why);
  }
  static std::string error_of(const redisReply* r) {
    return r->type == REDIS_REPLY_ERROR && r->str != nullptr ? std::string(r->str, r->len) : "unexpected reply";
  }

  std::chrono::milliseconds timeout_;
  redisContext* ctx_ = nullptr;
};

RendezvousStore::RendezvousStore(const std::string& address, const std::string& job_id,
                                 std::chrono::milliseconds io_timeout)
    : address_(address), job_id_(job_id), io_timeout_(io_timeout) {
  if (job_id.empty() || job_id.find('/') != std::string::npos) {
    throw InvalidArgument("job id '" + job_id + "' must be non-empty and contain no '/'");
  }
  try {
    if (address.rfind("file:", 0) == 0 && address.size() > 5) {
      const std::string dir = address.substr(5);
      make_dirs(dir);
      // A file there: its hashed key paths failed with "Not a directory".
      if (struct stat st {}; ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        throw InvalidArgument("rendezvous '" + address + "': " + dir +
                              " is not a directory; give file:DIR, a directory every rank can reach (made if missing).");
      }
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
      redis_client_ = std::make_unique<RedisClient>(host_, port_, io_timeout);
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
  try {
    const bool set = redis().set_if_absent(key(k), value);
    unresponsive_ = false;
    return set;
  } catch (const IoError& e) {
    redis_client_.reset();  // dead after a timeout: the next call connects again
    unresponsive_ = is_timeout(e);
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
  try {
    auto value = redis().get(key(k));
    unresponsive_ = false;
    return value;
  } catch (const IoError& e) {
    redis_client_.reset();  // dead after a timeout: the next call connects again
    unresponsive_ = is_timeout(e);
    throw IoError("rendezvous " + address_ + ": cannot read " + key(k) + ": " + e.what());
  }
}

void RendezvousStore::remove(const std::string& k) noexcept {
  std::lock_guard lock(mu_);
  try {
    redis_ ? redis().remove(key(k)) : static_cast<ProbingFileStore&>(*store_).remove(key(k));
  } catch (const IoError& e) {  // best effort: a key left behind only matters to a later job with the same id
    if (redis_) redis_client_.reset(), unresponsive_ = is_timeout(e);
  } catch (...) {
    if (redis_) redis_client_.reset();
  }
}

RedisClient& RendezvousStore::redis() {
  if (!redis_client_) redis_client_ = std::make_unique<RedisClient>(host_, port_, io_timeout_);
  return *redis_client_;
}

}  // namespace lockstep::comm::gloo_backend
