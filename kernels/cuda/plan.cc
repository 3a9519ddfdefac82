#include "kernels/cuda/plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace chunkattn::cuda {
namespace {

absl::Status CheckShape(const AttentionShape& shape, int chunk_size) {
  if (shape.num_kv_heads <= 0 || shape.num_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%d query heads is not a multiple of %d kv heads",
                                                      shape.num_heads, shape.num_kv_heads));
  }
  if (shape.group_size() > kTileRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GQA group of %d query heads per kv head: the CUDA kernels take at most %d", shape.group_size(), kTileRows));
  }
  if (!IsValidChunkSize(chunk_size)) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk size %d is not a power of two in [%d, %d]",
                                                      chunk_size, kMinChunkSize, kMaxChunkSize));
  }
  return absl::OkStatus();
}

// KV positions are int32 in the kernel; no real sequence comes near this.
constexpr int64_t kMaxPositions = int64_t{1} << 30;

bool HeavierFirst(const WorkItem& a, const WorkItem& b) {
  if (a.num_chunks != b.num_chunks) return a.num_chunks > b.num_chunks;
  return a.num_rows > b.num_rows;
}

// A list of table entries read by the token rows [row_begin, row_end).
struct List {
  int32_t first = 0, num_chunks = 0, row_begin = 0, row_end = 0;
  int32_t pieces = 1;
  std::vector<int32_t> piece_slot;  // partial slot of row_begin in each piece; -1: direct output
};

}  // namespace

absl::StatusOr<DecodeWork> PlanDecodeWork(DecodeImpl impl, const ChunkContext& ctx, int64_t num_pool_chunks,
                                          const AttentionShape& shape, const PlanOptions& options) {
  RETURN_IF_ERROR(CheckShape(shape, ctx.chunk_size));
  ASSIGN_OR_RETURN(const DecodePlan plan, PlanDecode(ctx, num_pool_chunks));
  const int n = ctx.num_seqs(), g = shape.group_size(), kvh = shape.num_kv_heads, c = ctx.chunk_size;
  const int tile_seqs = kTileRows / g;  // token rows per chunk-first item
  DecodeWork work;
  work.version = ctx.version;
  work.impl = impl;
  work.num_seqs = n;
  work.num_shared = ctx.num_shared();
  work.table_size = static_cast<int>(ctx.private_chunk.size());
  work.num_heads = shape.num_heads;
  work.group = g;
  work.chunk_size = c;

  // The chunk table and the lists over it.
  auto add_shared = [&](int32_t k) {
    work.table_chunk.push_back(ctx.shared_chunk[k]);
    work.table_src.push_back(k);
  };
  auto add_private = [&](int32_t i) {
    work.table_chunk.push_back(ctx.private_chunk[i]);
    work.table_src.push_back(~i);
  };
  std::vector<List> shared_lists, seq_lists;  // seq_lists: at most one per sequence
  std::vector<int32_t> seq_list(n, -1);
  if (impl == DecodeImpl::kTpp) {
    for (int32_t k = 0; k < ctx.num_shared(); ++k) add_shared(k);
    for (const DecodePlan::Run& run : plan.runs) {
      List l;
      l.first = run.first;
      l.num_chunks = run.last - run.first;
      l.row_begin = run.begin;
      l.row_end = run.end;
      shared_lists.push_back(l);
    }
    // Only the sequences' private ranges, not the gaps between them, so the
    // table never outgrows the sequences' chunks (BoundDecodeWork).
    for (int s = 0; s < n; ++s) {
      if (ctx.private_end[s] == ctx.private_begin[s]) continue;
      List l;
      l.first = static_cast<int32_t>(work.table_chunk.size());
      for (int32_t i = ctx.private_begin[s]; i < ctx.private_end[s]; ++i) add_private(i);
      l.num_chunks = ctx.private_end[s] - ctx.private_begin[s];
      l.row_begin = s;
      l.row_end = s + 1;
      seq_list[s] = static_cast<int32_t>(seq_lists.size());
      seq_lists.push_back(l);
    }
  } else {
    for (int s = 0; s < n; ++s) {
      List l;
      l.first = static_cast<int32_t>(work.table_chunk.size());
      for (int32_t i = plan.seq_run_begin[s]; i < plan.seq_run_begin[s + 1]; ++i) {
        const DecodePlan::Run& run = plan.runs[plan.seq_runs[i]];
        for (int32_t k = run.first; k < run.last; ++k) add_shared(k);
      }
      for (int32_t i = ctx.private_begin[s]; i < ctx.private_end[s]; ++i) add_private(i);
      l.num_chunks = static_cast<int32_t>(work.table_chunk.size()) - l.first;
      l.row_begin = s;
      l.row_end = s + 1;
      seq_list[s] = static_cast<int32_t>(seq_lists.size());
      seq_lists.push_back(l);
    }
  }
  if (work.table_chunk.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2)) {
    return absl::InvalidArgumentError("chunk context: chunk table too large");
  }
  for (const std::vector<List>* ls : {&shared_lists, &seq_lists}) {
    for (const List& l : *ls) {
      if (int64_t{l.num_chunks} * c > kMaxPositions) {
        return absl::InvalidArgumentError(absl::StrFormat("a sequence of %d chunks is too long", l.num_chunks));
      }
    }
  }

  // Split-KV: cut every list longer than its balanced share of the work (the
  // chunk reads of all items over twice the items the GPU runs at once), so
  // that neither a long shared run nor a long tail leaves the GPU waiting on
  // a few blocks.
  auto tiles = [&](const List& l) { return (l.row_end - l.row_begin + tile_seqs - 1) / tile_seqs; };
  int64_t visits = 0;
  for (const std::vector<List>* ls : {&shared_lists, &seq_lists}) {
    for (const List& l : *ls) visits += int64_t{tiles(l)} * kvh * l.num_chunks;
  }
  if (options.concurrent_items > 0) {
    const int64_t target = 2 * int64_t{options.concurrent_items};
    const int64_t min_chunks = std::max<int64_t>(1, (options.min_piece_tokens + c - 1) / c);
    const int64_t share = std::max(min_chunks, (visits + target - 1) / target);
    for (std::vector<List>* ls : {&shared_lists, &seq_lists}) {
      for (List& l : *ls) l.pieces = static_cast<int32_t>((l.num_chunks + share - 1) / share);
    }
  }

  // Partial slots: per piece of a shared list, one per sequence it covers; per
  // piece of a sequence list, one, unless that piece is the sequence's only
  // item (then it writes the output itself).
  std::vector<int32_t> runs_of(n, 0);
  for (int s = 0; s < n; ++s) runs_of[s] = impl == DecodeImpl::kTpp ? plan.seq_run_begin[s + 1] - plan.seq_run_begin[s] : 0;
  int64_t slots = 0;
  for (List& l : shared_lists) {
    for (int p = 0; p < l.pieces; ++p) {
      l.piece_slot.push_back(static_cast<int32_t>(slots));
      slots += l.row_end - l.row_begin;
    }
  }
  for (List& l : seq_lists) {
    const bool direct = l.pieces == 1 && runs_of[l.row_begin] == 0;
    for (int p = 0; p < l.pieces; ++p) {
      l.piece_slot.push_back(direct ? -1 : static_cast<int32_t>(slots));
      if (!direct) ++slots;
    }
  }
  if (slots * shape.num_heads > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("chunk context: too many partial states");
  }
  work.num_slots = slots;

  // Items.
  for (const std::vector<List>* ls : {&shared_lists, &seq_lists}) {
    for (const List& l : *ls) {
      for (int p = 0; p < l.pieces; ++p) {
        const int32_t c0 = static_cast<int32_t>(int64_t{l.num_chunks} * p / l.pieces);
        const int32_t c1 = static_cast<int32_t>(int64_t{l.num_chunks} * (p + 1) / l.pieces);
        for (int32_t r0 = l.row_begin; r0 < l.row_end; r0 += tile_seqs) {
          for (int h = 0; h < kvh; ++h) {
            WorkItem it;
            it.kv_head = h;
            it.list = l.first + c0;
            it.num_chunks = c1 - c0;
            it.row0 = r0;
            it.num_rows = std::min(tile_seqs, l.row_end - r0) * g;
            it.slot = l.piece_slot[p] < 0 ? -1 : l.piece_slot[p] + (r0 - l.row_begin);
            work.items.push_back(it);
          }
        }
      }
    }
  }
  std::stable_sort(work.items.begin(), work.items.end(), HeavierFirst);

  // Merge lists.
  work.merge_begin.push_back(0);
  for (int s = 0; s < n; ++s) {
    const size_t before = work.merge_slot.size();
    if (impl == DecodeImpl::kTpp) {
      for (int32_t i = plan.seq_run_begin[s]; i < plan.seq_run_begin[s + 1]; ++i) {
        const List& l = shared_lists[plan.seq_runs[i]];
        for (int32_t base : l.piece_slot) work.merge_slot.push_back(base + (s - l.row_begin));
      }
    }
    if (seq_list[s] >= 0) {
      for (int32_t base : seq_lists[seq_list[s]].piece_slot) {
        if (base >= 0) work.merge_slot.push_back(base);
      }
    }
    if (work.merge_slot.size() == before) continue;  // written directly
    work.max_merge = std::max(work.max_merge, static_cast<int>(work.merge_slot.size() - before));
    work.merge_seq.push_back(s);
    work.merge_begin.push_back(static_cast<int32_t>(work.merge_slot.size()));
  }
  return work;
}

DecodeWorkBounds BoundDecodeWork(DecodeImpl impl, int max_seqs, int max_seq_chunks, const AttentionShape& shape,
                                 const PlanOptions& options) {
  const int64_t b = std::max(max_seqs, 0), l = std::max(max_seq_chunks, 0);
  const int64_t kvh = std::max(shape.num_kv_heads, 1);
  const int64_t tile_seqs = std::max(kTileRows / std::max(shape.group_size(), 1), 1);
  const int64_t target = options.concurrent_items > 0 ? 2 * int64_t{options.concurrent_items} : 0;
  // Sum over runs of the sequences each reads, and the number of runs.
  const int64_t run_rows = impl == DecodeImpl::kTpp && b >= 2 ? b * std::min(l, b - 1) : 0;
  const int64_t runs = std::min(std::max<int64_t>(b - 1, 0), run_rows / 2);
  const int64_t tiles = runs + (run_rows + tile_seqs - 1) / tile_seqs + b;  // shared lists, then one per sequence
  DecodeWorkBounds bounds;
  bounds.table = b * l;
  bounds.items = kvh * tiles + target;
  bounds.slots = run_rows + b + tile_seqs * ((target + kvh - 1) / kvh);
  bounds.merge_seqs = b;
  bounds.merge_slots = bounds.slots;
  return bounds;
}

absl::Status FillTokens(const DecodeWork& work, const ChunkContext& ctx, std::vector<int32_t>* tokens) {
  if (ctx.version != work.version || ctx.num_seqs() != work.num_seqs || ctx.num_shared() != work.num_shared ||
      ctx.private_chunk.size() != static_cast<size_t>(work.table_size) ||
      ctx.private_tokens.size() != ctx.private_chunk.size() ||
      ctx.shared_tokens.size() != static_cast<size_t>(work.num_shared) || ctx.chunk_size != work.chunk_size) {
    return absl::FailedPreconditionError("decode: the work was planned for another context version");
  }
  tokens->resize(work.table_chunk.size());
  for (size_t i = 0; i < work.table_chunk.size(); ++i) {
    const int32_t src = work.table_src[i];
    const int32_t t = src >= 0 ? ctx.shared_tokens[src] : ctx.private_tokens[~src];
    if (t < 1 || t > work.chunk_size) {
      return absl::InvalidArgumentError(absl::StrFormat("%s entry %d holds %d tokens, outside [1, %d]",
                                                        src >= 0 ? "shared" : "private", src >= 0 ? src : ~src, t,
                                                        work.chunk_size));
    }
    (*tokens)[i] = t;
  }
  return absl::OkStatus();
}

absl::StatusOr<PrefillWork> PlanPrefillWork(const PrefillBatch& batch, int chunk_size, int64_t num_pool_chunks,
                                            const AttentionShape& shape) {
  RETURN_IF_ERROR(CheckShape(shape, chunk_size));
  RETURN_IF_ERROR(ValidatePrefillBatch(batch, chunk_size, num_pool_chunks));
  const int g = shape.group_size(), c = chunk_size;
  const int tile_tokens = kTileRows / g;
  PrefillWork work;
  work.group = g;
  work.chunk_size = c;
  work.table_chunk = batch.chunk_ids;
  work.table_tokens.assign(batch.chunk_ids.size(), 0);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t new_tokens = batch.q_begin[s + 1] - batch.q_begin[s];
    const int64_t len = int64_t{batch.prefix_len[s]} + new_tokens;
    if (len > kMaxPositions) {
      return absl::InvalidArgumentError(absl::StrFormat("prefill batch: sequence %d of %d tokens is too long", s, len));
    }
    for (int32_t e = batch.chunk_begin[s]; e < batch.chunk_begin[s + 1]; ++e) {
      const int64_t left = len - int64_t{e - batch.chunk_begin[s]} * c;
      work.table_tokens[e] = static_cast<int32_t>(std::clamp<int64_t>(left, 0, c));
    }
    for (int32_t t0 = 0; t0 < new_tokens; t0 += tile_tokens) {
      const int32_t count = std::min(tile_tokens, new_tokens - t0);
      const int32_t last_pos = batch.prefix_len[s] + t0 + count - 1;
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        WorkItem it;
        it.kv_head = h;
        it.list = batch.chunk_begin[s];
        it.num_chunks = last_pos / c + 1;
        it.row0 = batch.q_begin[s] + t0;
        it.num_rows = count * g;
        it.pos0 = batch.prefix_len[s] + t0;
        work.items.push_back(it);
      }
    }
  }
  std::stable_sort(work.items.begin(), work.items.end(), HeavierFirst);
  return work;
}

}  // namespace chunkattn::cuda
