// Blob framing (versioned, size-checked), the two-phase Wiring helper, and PmixBootstrap refusing
// to start without a PMIx server. The PMIx exchange itself is tested through weftrun (tests/launcher).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>

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
