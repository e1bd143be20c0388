// GroupBootstrap: a rank group's exchanges through the parent's subset exchange, or framed over a job-wide one.
#include "bootstrap/group_bootstrap.h"

#include "base/log.h"
#include "bootstrap/blob.h"

namespace weft::bootstrap {
namespace {

constexpr uint16_t kGroupKind = 24, kGroupVersion = 1;

}  // namespace

Status GroupBootstrap::create(Bootstrap* parent, const GroupShape& shape, std::unique_ptr<GroupBootstrap>* out,
                              std::string* error) {
  const RankInfo& p = parent->info();
  auto refuse = [&](const std::string& what) {
    *error = "rank " + std::to_string(p.rank) + ": rank group " + std::to_string(shape.group_nodes) + " x " +
             std::to_string(shape.group_gpus) + " in a job of " + std::to_string(shape.nodes) + " x " +
             std::to_string(shape.gpus_per_node) + ": " + what;
    return Status::kInvalidArgument;
  };
  if (!shape.valid()) return refuse("the group does not tile the job");
  if (p.size != shape.world_size())
    return refuse("the job has " + std::to_string(p.size) + " ranks, expected " + std::to_string(shape.world_size()));
  // Block placement, as this rank sees it (every rank's view: check_block_placement).
  if (p.node != p.rank / shape.gpus_per_node || p.local_rank != p.rank % shape.gpus_per_node)
    return refuse("this rank is local rank " + std::to_string(p.local_rank) + " of node " + std::to_string(p.node) +
                  ", expected local rank " + std::to_string(p.rank % shape.gpus_per_node) + " of node " +
                  std::to_string(p.rank / shape.gpus_per_node) + " (block placement)");
  std::unique_ptr<GroupBootstrap> g(new GroupBootstrap());
  g->parent_ = parent;
  g->subset_ = dynamic_cast<SubsetExchange*>(parent);
  g->shape_ = shape;
  g->pos_ = group_position(shape, p.rank);
  g->members_ = group_members(shape, g->pos_.group);
  g->scope_ = "group" + std::to_string(g->pos_.group);
  RankInfo& i = g->info_;
  i.rank = g->pos_.rank;
  i.size = shape.group_size();
  i.local_rank = g->pos_.local_rank;
  i.local_size = shape.group_gpus;
  i.node = g->pos_.node;
  i.num_nodes = shape.group_nodes;
  i.hostname = p.hostname;
  i.nspace = p.nspace + "/" + g->scope_;
  WEFT_INFO(kBoot, "rank %d: group %d of %d (%d x %d), rank %d of %d; exchanges %s", p.rank, g->pos_.group,
            shape.num_groups(), shape.group_nodes, shape.group_gpus, i.rank, i.size,
            g->subset_ ? "among the group's members" : "job-wide, filtered to the group");
  *out = std::move(g);
  return Status::kOk;
}

Status GroupBootstrap::allgather(const std::string& key, const Blob& mine, std::vector<Blob>* all) {
  if (subset_) return subset_->subset_allgather(scope_, key, members_, mine, all);
  return allgather_job_wide(key, mine, all);
}

Status GroupBootstrap::allgather_job_wide(const std::string& key, const Blob& mine, std::vector<Blob>* all) {
  if (mine.size() > kMaxBlobBytes - 16) {
    WEFT_WARN(kBoot, "rank %d (%s): allgather '%s': %zu bytes, more than a blob may hold", parent_->info().rank,
              scope_.c_str(), key.c_str(), mine.size());
    return Status::kInvalidArgument;
  }
  BlobWriter w;
  w.u32(static_cast<uint32_t>(pos_.group));
  w.u32(static_cast<uint32_t>(parent_->info().rank));
  w.bytes(mine);
  std::vector<Blob> job;
  // One key for every group: the parent's allgather is collective over the whole job.
  WEFT_CHECK(parent_->allgather("groups/" + key, seal_blob(kGroupKind, kGroupVersion, w.blob()), &job));
  if (job.size() != static_cast<size_t>(shape_.world_size())) {
    WEFT_WARN(kBoot, "rank %d (%s): allgather '%s': %zu entries from the job, expected %d", parent_->info().rank,
              scope_.c_str(), key.c_str(), job.size(), shape_.world_size());
    return Status::kProtocolError;
  }
  all->assign(members_.size(), Blob());
  for (size_t i = 0; i < members_.size(); ++i) {
    const int from = members_[i];
    Blob payload;
    WEFT_CHECK(open_blob(job[static_cast<size_t>(from)], kGroupKind, kGroupVersion, from, "group entry", &payload));
    BlobReader r(payload);
    uint32_t group = 0, rank = 0;
    if (!r.u32(&group) || !r.u32(&rank) || !r.bytes(&(*all)[i]) || !r.done() || static_cast<int>(group) != pos_.group ||
        static_cast<int>(rank) != from) {
      WEFT_WARN(kBoot, "rank %d (%s): allgather '%s': the entry of job rank %d claims group %u, rank %u",
                parent_->info().rank, scope_.c_str(), key.c_str(), from, group, rank);
      return Status::kProtocolError;
    }
  }
  return Status::kOk;
}

Status GroupBootstrap::barrier(const std::string& tag) {
  if (subset_) return subset_->subset_barrier(scope_, tag, members_);
  std::vector<Blob> all;
  return allgather("barrier:" + tag, Blob(), &all);
}

void GroupBootstrap::abort(const std::string& why) { parent_->abort(scope_ + ": " + why); }

}  // namespace weft::bootstrap
