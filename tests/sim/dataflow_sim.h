// An event-system model of a multi-rank data flow, CUDA-free: the op's plans are turned into
// actions (a copy, a proxy put, a forward, a GEMM tile's reduction) on per-rank streams, and the
// simulator fires each action once the flags it waits on have the awaited values.
//
//   stream (rank, "copy"):    [wait f1 >= e] ─► read regions ─► write regions (+ link bytes) ─► set flags
//   stream (rank, "compute"): [wait f2 >= e] ─► read ... ─► check what arrived
//
// Streams run their actions in order (a persistent GEMM walking its tiles, a copy engine's queue,
// the proxy thread's sends), actions of different streams in any order the flags allow. Every
// region carries a labelled payload (which block of the output, how many times each rank's
// contribution is in it, which run wrote it), so the op's checks look at what arrived, not at how.
//
// What the simulator itself checks, with messages naming the rank, the action and the flag:
//   - no deadlock: every stream runs to its end; a stuck stream is reported with the flag it waits
//     on and either "no action left sets it" or the cycle of streams waiting on each other;
//   - no race: a read happens after the write it reads (a chain of waits orders them: vector
//     clocks), a write after the reads of the data it replaces (slot reuse across runs), and no
//     region is written twice in one run;
//   - bytes per link: every write says over which link (NVLink, NIC) from which rank it travels.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace weft::sim {

enum class Link : int { kLocal = 0, kNvlink = 1, kNic = 2 };
const char* to_string(Link l);

// A flag word or a data region in one rank's memory: `kind` names it (Sim::kind), a, b, c index it.
struct Key {
  int rank = -1, kind = 0, a = 0, b = 0, c = 0;
  bool operator<(const Key& o) const { return std::tie(rank, kind, a, b, c) < std::tie(o.rank, o.kind, o.a, o.b, o.c); }
  bool operator==(const Key& o) const { return !(*this < o) && !(o < *this); }
};

// What a region holds: which block of the result (a shard, an owner's row block), which piece of
// it, how many times each rank's contribution is in it (an all-gather shard: its owner once; a
// reduce-scatter sum: every rank once; sparse: rank -> count) and which run wrote it (0: the input).
struct Payload {
  int block = -1, piece = 0;
  std::map<int, int> parts;
  uint64_t epoch = 0;
};

struct Wait {
  Key flag;
  uint64_t value = 0;  // fires once the flag is >= value
};
struct Read {
  Key region;
  bool may_be_empty = false;  // a region nothing writes in this run (a slot's zero part) reads as nullptr
};
struct Write {
  Key region;
  Link link = Link::kLocal;
  int from = -1;  // the rank whose bytes travel (link bytes are tallied from -> region.rank)
  int64_t bytes = 0;
};
struct SetFlag {
  Key flag;
  uint64_t value = 0;
  // A counter: the value is added (an atomic add with release), and a wait that the sum satisfies
  // is ordered after every add up to it; otherwise the flag becomes max(flag, value).
  bool add = false;
  // A store: the value as is (it may go down: a token reset to 0, a counter zeroed for reuse); a wait
  // is ordered after the last store and every add since, up to the value it met. A store that
  // replaces a value no wait has seen yet loses it; the simulator finds that as a wait that never
  // comes (a deadlock), or as data read too early. (Two stores of a value that meets a wait: the
  // wait is ordered after the later one.)
  bool store = false;
};

// in: the payloads of the reads, in order (nullptr for an empty region); out: one payload per write.
// False with *why when what arrived is wrong (the op's data check).
using Body = std::function<bool(const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why)>;

struct Action {
  int stream = -1;   // Sim::stream
  std::string what;  // for messages: "forward of shard 5 chunk 1 (position 6) to rank 3"
  std::vector<Wait> waits;
  std::vector<Read> reads;
  std::vector<Write> writes;
  std::vector<SetFlag> sets;
  Body body;  // may be empty when there are no writes
};

// Bytes per link: (link, from, to) -> bytes.
using LinkBytes = std::map<std::tuple<Link, int, int>, int64_t>;

struct Result {
  // The first kMaxErrors problems found while running, in the order found, then up to kMaxErrors
  // stuck streams (those waiting on a flag no action sets first).
  std::vector<std::string> errors;
  int fired = 0, actions = 0;
  LinkBytes link_bytes;
  bool ok() const { return errors.empty(); }
  std::string text() const;  // the errors, one per line
  // True when some error contains `needle` (tests look for the kind of failure).
  bool mentions(const std::string& needle) const;
};

class Sim {
 public:
  static constexpr int kMaxErrors = 20;
  // Registers (or finds) a kind of key; the index names say what a, b and c are ("position", "chunk").
  int kind(const std::string& name, const std::string& a_name = "", const std::string& b_name = "",
           const std::string& c_name = "");
  int stream(int rank, const std::string& name);
  // A kind of flag indexed by a stream (a = Sim::stream): messages name the stream.
  int stream_kind(const std::string& name);
  // Data present before the first action (the op's input); never a race.
  void input(const Key& region, Payload p);
  void add(Action a);
  // Race checks keep a vector clock (one entry per stream) per action: off for very large models
  // (128 x 8 ranks), where the deadlock and data checks still run.
  void check_races(bool on) { races_ = on; }
  // The order streams take turns in: 0 (the default) runs each stream as far as it can, in stream
  // order; a seed gives each stream a pace and draws the order of every turn, so that different
  // seeds try different interleavings (a test runs many).
  void schedule(uint64_t seed) { seed_ = seed; }
  Result run();

  std::string describe(const Key& k) const;
  std::string stream_name(int s) const;
  int stream_rank(int s) const { return streams_[size_t(s)].rank; }
  int num_streams() const { return int(streams_.size()); }
  const std::vector<int>& stream_actions(int s) const { return streams_[size_t(s)].actions; }

 private:
  struct KindInfo {
    std::string name, a, b, c;
    bool by_stream = false;
  };
  struct StreamInfo {
    int rank = -1;
    std::string name;
    std::vector<int> actions;
  };
  std::vector<KindInfo> kinds_;
  std::vector<StreamInfo> streams_;
  std::vector<Action> actions_;
  std::map<Key, Payload> inputs_;
  bool races_ = true;
  uint64_t seed_ = 0;
};

}  // namespace weft::sim
