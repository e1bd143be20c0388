// Blob framing (versioned, size-checked), the two-phase Wiring helper, and PmixBootstrap refusing
// to start without a PMIx server; the same-host exchange folder's safety checks. The PMIx exchange itself is tested
// through weftrun (tests/launcher).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>

#include "bootstrap/blob.h"
#include "bootstrap/node_exchange.h"
#include "bootstrap/pmix_bootstrap.h"
#include "bootstrap/wiring.h"

using namespace weft::bootstrap;
using weft::Status;

TEST_CASE("a sealed blob opens to the same payload; wrong kind, version, length or magic are rejected") {
  Blob payload = {1, 2, 3, 4, 5};
  Blob sealed = seal_blob(7, 3, payload);
  CHECK(sealed.size() == kBlobHeaderBytes + payload.size());
  Blob out;
  CHECK(open_blob(sealed, 7, 3, 0, "t", &out) == Status::kOk);
  CHECK(out == payload);
  CHECK(open_blob(sealed, 8, 3, 0, "t", &out) == Status::kProtocolError);  // kind
  CHECK(open_blob(sealed, 7, 4, 0, "t", &out) == Status::kProtocolError);  // version
  Blob truncated(sealed.begin(), sealed.end() - 1);
  CHECK(open_blob(truncated, 7, 3, 0, "t", &out) == Status::kProtocolError);
  Blob longer = sealed;
  longer.push_back(9);
  CHECK(open_blob(longer, 7, 3, 0, "t", &out) == Status::kProtocolError);
  Blob bad_magic = sealed;
  bad_magic[0] ^= 1;
  CHECK(open_blob(bad_magic, 7, 3, 0, "t", &out) == Status::kProtocolError);
  CHECK(open_blob(Blob{1, 2}, 7, 3, 0, "t", &out) == Status::kProtocolError);
}

TEST_CASE("BlobWriter/BlobReader round-trip fields and refuse to read past the end") {
  BlobWriter w;
  w.u32(0xdeadbeef);
  w.u64(0x0123456789abcdefull);
  w.f64(-2.5);
  w.str("node-1");
  w.bytes(Blob{9, 8, 7});
  Blob b = w.blob();
  BlobReader r(b);
  uint32_t a;
  uint64_t c;
  double d;
  std::string s;
  Blob e;
  REQUIRE((r.u32(&a) && r.u64(&c) && r.f64(&d) && r.str(&s) && r.bytes(&e)));
  CHECK(a == 0xdeadbeef);
  CHECK(c == 0x0123456789abcdefull);
  CHECK(d == -2.5);
  CHECK(s == "node-1");
  CHECK(e == Blob{9, 8, 7});
  CHECK(r.done());
  CHECK_FALSE(r.u32(&a));
  Blob lying = {200, 0, 0, 0, 'x'};  // a string claiming 200 bytes with 1 present
  BlobReader r2(lying);
  CHECK_FALSE(r2.str(&s));
}

namespace {
// A Bootstrap for a job of `size` ranks whose peers' entries were prepared in advance: enough to
// test the wiring logic without processes.
class FakeBootstrap : public Bootstrap {
 public:
  FakeBootstrap(int rank, std::vector<Blob> peers) : peers_(std::move(peers)) {
    info_.rank = rank;
    info_.size = static_cast<int>(peers_.size());
  }
  const RankInfo& info() const override { return info_; }
  Status allgather(const std::string& key, const Blob& mine, std::vector<Blob>* all) override {
    last_key = key;
    *all = peers_;
    (*all)[info_.rank] = mine;
    return Status::kOk;
  }
  Status barrier(const std::string&) override { return Status::kOk; }
  void abort(const std::string&) override {}
  std::string last_key;

 private:
  RankInfo info_;
  std::vector<Blob> peers_;
};

// What rank `r` publishes, captured through a fake job of one.
Blob published_by(uint16_t version, const std::string& addr) {
  struct Capture : Bootstrap {
    RankInfo i;
    Blob got;
    const RankInfo& info() const override { return i; }
    Status allgather(const std::string&, const Blob& mine, std::vector<Blob>* all) override {
      got = mine;
      *all = {mine};
      return Status::kOk;
    }
    Status barrier(const std::string&) override { return Status::kOk; }
    void abort(const std::string&) override {}
  } cap;
  Wiring w(cap, "net", version);
  w.publish("addr", Blob(addr.begin(), addr.end()));
  REQUIRE(w.exchange() == Status::kOk);
  return cap.got;
}
}  // namespace

TEST_CASE("Wiring: publish, one exchange, then every peer's entries by name") {
  std::vector<Blob> job = {Blob(), published_by(2, "10.0.0.2:5000"), published_by(2, "10.0.0.3:5000")};
  FakeBootstrap boot(0, job);
  Wiring w(boot, "net", 2);
  w.publish("addr", Blob{'m', 'e'});
  REQUIRE(w.exchange() == Status::kOk);
  CHECK(boot.last_key == "wire.net");
  const Blob* v = nullptr;
  REQUIRE(w.peer(2, "addr", &v) == Status::kOk);
  CHECK(std::string(v->begin(), v->end()) == "10.0.0.3:5000");
  REQUIRE(w.peer(0, "addr", &v) == Status::kOk);
  CHECK(*v == Blob{'m', 'e'});
  CHECK(w.peer(1, "heap_key", &v) == Status::kNotFound);
  CHECK(w.peer(3, "addr", &v) == Status::kInvalidArgument);
}

TEST_CASE("Wiring rejects a peer that published another version of the entries") {
  std::vector<Blob> job = {Blob(), published_by(1, "old")};
  FakeBootstrap boot(0, job);
  Wiring w(boot, "net", 2);
  w.publish("addr", Blob{1});
  CHECK(w.exchange() == Status::kProtocolError);
}

// Exchange keys are numbered per bootstrap object. Counted by address instead, a bootstrap made
// where an earlier one lived continued its numbers (on the ranks where the address came back, not
// on the others): two ranks' keys then disagreed.
TEST_CASE("a bootstrap made where an earlier one lived numbers its exchanges from 0") {
  struct Fake : Bootstrap {
    RankInfo i;
    const RankInfo& info() const override { return i; }
    Status allgather(const std::string&, const Blob&, std::vector<Blob>*) override { return Status::kOk; }
    Status barrier(const std::string&) override { return Status::kOk; }
    void abort(const std::string&) override {}
  };
  alignas(Fake) unsigned char storage[sizeof(Fake)];
  Fake* a = new (storage) Fake();
  CHECK(a->next_exchange_id() == 0);
  CHECK(a->next_exchange_id() == 1);
  a->~Fake();
  Fake* b = new (storage) Fake();
  CHECK(static_cast<void*>(b) == static_cast<void*>(a));
  CHECK(b->next_exchange_id() == 0);
  b->~Fake();
}

TEST_CASE("without a PMIx server in the environment, connect fails at once instead of hanging") {
  unsetenv("PMIX_NAMESPACE");
  unsetenv("PMIX_RANK");
  CHECK_FALSE(started_under_pmix());
  std::unique_ptr<PmixBootstrap> boot;
  CHECK(PmixBootstrap::connect(&boot) == Status::kUnsupported);
  CHECK(boot == nullptr);
  setenv("PMIX_NAMESPACE", "x", 1);
  setenv("PMIX_RANK", "0", 1);
  CHECK_FALSE(started_under_pmix());  // no PMIX_SERVER_URI*: still not under a server
  unsetenv("PMIX_NAMESPACE");
  unsetenv("PMIX_RANK");
}

TEST_CASE("node exchange: peers read each other's files; the folder goes only when every member is done") {
  const std::string nspace = "test-node-exchange-" + std::to_string(getpid());
  std::string dir;
  {
    NodeExchange a, b;
    REQUIRE(a.init(nspace, 0) == Status::kOk);
    REQUIRE(b.init(nspace, 1) == Status::kOk);
    REQUIRE(a.publish("k.1", seal_blob(1, 1, Blob{1, 2, 3})) == Status::kOk);
    REQUIRE(b.publish("k.1", seal_blob(1, 1, Blob{4, 5})) == Status::kOk);
    Blob got, payload;
    REQUIRE(b.fetch("k.1", 0, &got));
    REQUIRE(open_blob(got, 1, 1, 0, "k.1", &payload) == Status::kOk);
    CHECK(payload == Blob{1, 2, 3});
    CHECK_FALSE(a.fetch("k.1", 7, &got));  // no such rank on this host: the caller asks PMIx
    REQUIRE(a.publish("k.2", seal_blob(1, 1, Blob{9})) == Status::kOk);
    a.retire_all_but("k.2");
    CHECK_FALSE(b.fetch("k.1", 0, &got));  // retired after the next exchange's fence
    CHECK(b.fetch("k.2", 0, &got));
    dir = NodeExchange::job_dir(
        nspace, [](const char* n, void*) -> const char* { return getenv(n); }, nullptr);
    {
      NodeExchange c;  // a rank that finishes first must not take the others' last files away
      REQUIRE(c.init(nspace, 2) == Status::kOk);
    }
    CHECK(b.fetch("k.2", 0, &got));
    CHECK(access(dir.c_str(), F_OK) == 0);
  }
  CHECK(access(dir.c_str(), F_OK) != 0);  // the last member removed it
}

// The same-host exchange folder under a shared /dev/shm (issue 24): nothing planted there is used.
namespace {

std::string dir_of(const std::string& nspace) {
  return NodeExchange::job_dir(
      nspace, [](const char* n, void*) -> const char* { return getenv(n); }, nullptr);
}
std::string base_of(const std::string& dir) { return dir.substr(0, dir.rfind('/')); }
bool exists(const std::string& p) {
  struct stat st {};
  return lstat(p.c_str(), &st) == 0;
}
std::string read_text(const std::string& p) {
  std::string s;
  if (FILE* f = fopen(p.c_str(), "rb")) {
    char b[256];
    size_t n;
    while ((n = fread(b, 1, sizeof b, f)) > 0) s.append(b, n);
    fclose(f);
  }
  return s;
}
void write_text(const std::string& p, const std::string& text) {
  FILE* f = fopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  fputs(text.c_str(), f);
  fclose(f);
}

}  // namespace

TEST_CASE("node exchange: the folder's name carries the uid; a folder of the wrong mode is refused, untouched") {
  const std::string nspace = "test-mode-" + std::to_string(getpid());
  const std::string dir = dir_of(nspace);
  CHECK(dir.find("/weft-" + std::to_string(geteuid()) + "-") != std::string::npos);
  REQUIRE(mkdir(dir.c_str(), 0700) == 0);
  REQUIRE(chmod(dir.c_str(), 0755) == 0);
  {
    NodeExchange x;
    CHECK(x.init(nspace, 0) == Status::kUnsupported);
    CHECK(x.publish("k", seal_blob(1, 1, Blob{1})) != Status::kOk);
    Blob b;
    CHECK_FALSE(x.fetch("k", 0, &b));
  }
  CHECK(std::filesystem::is_empty(dir));  // nothing was written into it, and it was not removed
  rmdir(dir.c_str());
}

TEST_CASE("node exchange: a folder owned by another user is refused") {
  if (geteuid() != 0) {
    printf("SKIPPED: a node-exchange folder of another owner (needs root to chown it to nobody)\n");
    return;
  }
  const std::string nspace = "test-owner-" + std::to_string(getpid());
  const std::string dir = dir_of(nspace);
  REQUIRE(mkdir(dir.c_str(), 0700) == 0);
  REQUIRE(chown(dir.c_str(), 65534, 65534) == 0);
  NodeExchange x;
  CHECK(x.init(nspace, 0) == Status::kUnsupported);
  CHECK(std::filesystem::is_empty(dir));
  CHECK(NodeExchange::remove_stale(base_of(dir)) == 0);  // another user's folder is never judged
  CHECK(exists(dir));
  rmdir(dir.c_str());
}

TEST_CASE("node exchange: a planted symlink as the folder is refused; its target is not written") {
  const std::string nspace = "test-symlink-" + std::to_string(getpid());
  const std::string dir = dir_of(nspace);
  const std::string target = "/tmp/weft-test-symlink-target-" + std::to_string(getpid());
  REQUIRE(mkdir(target.c_str(), 0700) == 0);  // even one of ours, of the right mode
  REQUIRE(symlink(target.c_str(), dir.c_str()) == 0);
  {
    NodeExchange x;
    CHECK(x.init(nspace, 0) == Status::kUnsupported);
  }
  CHECK(std::filesystem::is_empty(target));
  CHECK(NodeExchange::remove_stale(base_of(dir)) == 0);
  CHECK(exists(dir));
  unlink(dir.c_str());
  rmdir(target.c_str());
}

TEST_CASE("node exchange: planted links inside the folder are never written or read through") {
  const std::string nspace = "test-inner-" + std::to_string(getpid());
  const std::string victim = "/tmp/weft-test-victim-" + std::to_string(getpid());
  write_text(victim, "precious");
  NodeExchange x;
  REQUIRE(x.init(nspace, 0) == Status::kOk);
  const std::string dir = dir_of(nspace);
  struct stat st {};
  REQUIRE(lstat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  REQUIRE(symlink(victim.c_str(), (dir + "/k.0.tmp").c_str()) == 0);  // where publish writes first
  REQUIRE(symlink(victim.c_str(), (dir + "/k.3").c_str()) == 0);      // a "peer's" file
  CHECK(x.publish("k", seal_blob(1, 1, Blob{7})) == Status::kOk);
  CHECK(read_text(victim) == "precious");
  Blob b;
  CHECK(x.fetch("k", 0, &b));
  CHECK_FALSE(x.fetch("k", 3, &b));
  unlink(victim.c_str());
}

TEST_CASE("node exchange: a folder is stale only when no process holds its lock; stale ones go at start") {
  const std::string live_ns = "test-live-" + std::to_string(getpid());
  const std::string dead_ns = "test-dead-" + std::to_string(getpid());
  NodeExchange live;
  REQUIRE(live.init(live_ns, 0) == Status::kOk);
  // A rank killed while it used its folder: SIGKILL runs no destructor and no atexit handler.
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  fflush(nullptr);  // the child must not write this process's buffered output again
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    NodeExchange dead;
    char ok = dead.init(dead_ns, 0) == Status::kOk && dead.publish("k", seal_blob(1, 1, Blob{1})) == Status::kOk;
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char ok = 0;
  REQUIRE(read(ready[0], &ok, 1) == 1);
  REQUIRE(ok == 1);
  const std::string dead_dir = dir_of(dead_ns);
  CHECK(exists(dead_dir + "/k.0"));
  // While it lives it holds the lock: not stale, whatever its age.
  NodeExchange::remove_stale(base_of(dead_dir));
  CHECK(exists(dead_dir));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  CHECK(exists(dead_dir));
  // The next exchange to start on this host removes it; the live one stays.
  NodeExchange next;
  REQUIRE(next.init("test-next-" + std::to_string(getpid()), 0) == Status::kOk);
  CHECK_FALSE(exists(dead_dir));
  CHECK(exists(dir_of(live_ns)));
  Blob b;
  CHECK(live.publish("k", seal_blob(1, 1, Blob{2})) == Status::kOk);
  CHECK(live.fetch("k", 0, &b));
}

TEST_CASE("node exchange: a rank that calls exit() still removes its folder when it is the last") {
  const std::string nspace = "test-exit-" + std::to_string(getpid());
  fflush(nullptr);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto* x = new NodeExchange;  // never destroyed: exit() skips it, the atexit handler does not
    if (x->init(nspace, 0) != Status::kOk || x->publish("k", seal_blob(1, 1, Blob{1})) != Status::kOk) _exit(2);
    exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(exists(dir_of(nspace)));
}

TEST_CASE("a blob header claiming more than kMaxBlobBytes is refused before anything is copied") {
  Blob sealed = seal_blob(7, 3, Blob{1, 2, 3});
  const uint32_t huge = static_cast<uint32_t>(kMaxBlobBytes + 1);
  for (int i = 0; i < 4; ++i) sealed[8 + i] = static_cast<uint8_t>(huge >> (8 * i));
  Blob out = {9};
  CHECK(open_blob(sealed, 7, 3, 0, "t", &out) == Status::kProtocolError);
  CHECK(out == Blob{9});
}
