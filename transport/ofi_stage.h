// Host staging for device heaps on the ofi backend: the slot ring between two ranks, its credits, and the
// receiver's in-order apply (pure bookkeeping, tested without libfabric).
//
//   sender rank s                                     receiver rank r
//   device heap --from_region--> send stage slot k    receive stage [s][k] --to_region--> device heap
//                 fi_writedata(header+payload, CQ data = s<<16 | k)  ------>  CQ entry: slot k of s arrived
//                 <------ credit message (slots consumed) after r applied them in sequence order
//
// The receiver applies slots strictly in sequence order, so a signal is set only after every earlier
// put from that sender has been copied in: staged traffic needs no fence.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::transport {

constexpr uint32_t kStageMagic = 0x53544657u;  // "WFTS"
enum class StageKind : uint32_t { kPut = 1, kSignal = 2 };

// At the start of every slot: what the payload after it is and where it goes.
struct StageHeader {
  uint32_t magic;
  uint32_t kind;             // StageKind
  uint64_t seq;              // per (sender, receiver) pair, from 0
  uint64_t dst_offset;       // heap offset (flag offset for a signal)
  uint64_t length_or_value;  // payload bytes after the header, or the signal's value
};
static_assert(sizeof(StageHeader) == 32, "StageHeader is 32 bytes on the wire");

inline uint64_t stage_cq_data(int sender, uint32_t slot) { return (static_cast<uint64_t>(sender) << 16) | slot; }
inline void stage_cq_split(uint64_t data, int* sender, uint32_t* slot) {
  *sender = static_cast<int>((data >> 16) & 0xffff);
  *slot = static_cast<uint32_t>(data & 0xffff);
}

// The sender's side of one ring: a slot is reused once the receiver gave credit for it and its own
// write completed locally.
class StageSender {
 public:
  explicit StageSender(uint32_t slots = 0) : busy_(slots, false) {}
  bool can_take() const {
    const uint32_t n = static_cast<uint32_t>(busy_.size());
    return n && sent_ - credited_ < n && !busy_[sent_ % n];
  }
  uint32_t take(uint64_t* seq) {
    const uint32_t slot = static_cast<uint32_t>(sent_ % busy_.size());
    busy_[slot] = true;
    *seq = sent_++;
    return slot;
  }
  // Gives back the slot just taken (the write could not be posted yet).
  void untake(uint32_t slot) {
    busy_[slot] = false;
    --sent_;
  }
  void local_complete(uint32_t slot) { busy_[slot] = false; }
  // The receiver has applied `consumed` slots in all; false if that cannot be (more than sent).
  bool credit(uint64_t consumed) {
    if (consumed > sent_) return false;
    if (consumed > credited_) credited_ = consumed;
    return true;
  }
  uint64_t in_flight() const { return sent_ - credited_; }

 private:
  std::vector<bool> busy_;
  uint64_t sent_ = 0, credited_ = 0;
};

// The receiver's side: slots arrive in any order, are applied in sequence order, and credit is
// returned once applied.
class StageReceiver {
 public:
  explicit StageReceiver(uint32_t slots = 0) : ready_(slots, false) {}
  // False if the slot is out of range or already waiting (a sender overran its credit).
  bool arrived(uint32_t slot) {
    if (slot >= ready_.size() || ready_[slot]) return false;
    ready_[slot] = true;
    return true;
  }
  // The next slot in sequence, if it has arrived.
  bool next(uint32_t* slot, uint64_t* seq) const {
    if (ready_.empty()) return false;
    const uint32_t s = static_cast<uint32_t>(next_ % ready_.size());
    if (!ready_[s]) return false;
    *slot = s;
    *seq = next_;
    return true;
  }
  void consume() {
    ready_[next_ % ready_.size()] = false;
    ++next_;
  }
  uint64_t consumed() const { return next_; }
  // Credit not yet returned to the sender.
  bool credit_due() const { return next_ > credit_sent_; }
  void credit_sent(uint64_t upto) { credit_sent_ = upto; }

 private:
  std::vector<bool> ready_;
  uint64_t next_ = 0, credit_sent_ = 0;
};

}  // namespace weft::transport
