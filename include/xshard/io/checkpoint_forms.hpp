#pragma once
/// \file
/// The two on-disk forms of a checkpoint (stored_blocks.hpp): what their headers hold, and
/// the writing of the files that the collective saves (checkpoint_save.hpp) and the offline
/// tools (offline.hpp) share.
///
/// Integrated form: one safetensors file, every tensor whole, with `__metadata__`
/// {"format": "xshard", "xshard.version": "2", "xshard.step": "<step>",
///  "xshard.strategy": <the strategy file's JSON>, "xshard.crc32": {name: "<8 hex digits>"},
///  "xshard.block_crc32": {name: "<8 hex digits per stored block>"}}.
/// `xshard.crc32` is each tensor's CRC-32 whole (what Python's `zlib.crc32` checks);
/// `xshard.block_crc32` (version 2) the CRC-32 of each block the saving ranks held (the blocks
/// of the strategy's layout, one per primary holder in mesh rank order, each block's bytes in
/// its own row-major order): what a load checks, so that a rank reading whole blocks verifies
/// them as it reads them, in one pass. Version 1 files (no block CRCs) and foreign files are
/// read too, each tensor then one stored block.
/// Per-rank form: a directory of `rank_<r>.safetensors` (rank r's blocks, with
/// {"format": "xshard-rank", "xshard.rank": "<r>", "xshard.crc32": {...}}), `strategy.json`
/// and `checkpoint.json` ({"format": "xshard-checkpoint", "version": 1, "step", "ranks"}).

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/io/strategy_file.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xshard::detail {

/// The header of an integrated checkpoint of `entries` (offsets set here), with the CRC-32 of
/// each (in entry order) and of each of its stored blocks (`block_crcs[i]`, in the order of
/// primary_blocks; a tensor with none gets no block checksums). Zeros where not known yet:
/// the header keeps its length whatever the checksums, so that it can be written first and
/// rewritten once they are known.
XSHARD_DECL std::string
integrated_header(std::vector<tensor_entry>& entries, const strategy_file& strategy,
                  std::int64_t step, const std::vector<std::optional<std::uint32_t>>& crcs = {},
                  const std::vector<std::vector<std::uint32_t>>& block_crcs = {});

/// A block CRC map ({"name": "<8 lowercase hex digits per block>", ...}), else io_error.
XSHARD_DECL std::map<std::string, std::string> parse_block_checksums(const std::string& text);

/// Writes rank `rank`'s file of a per-rank checkpoint in directory `dir`: each tensor's block
/// (entries with the block's extent as shape, and its bytes), checksummed as it is written
/// (the header, whose length does not depend on the checksums, is written last), fsynced,
/// its size checked, read back and checksummed again, closed. The file is created exclusively
/// (never through a link, never an existing file).
XSHARD_DECL void write_rank_file(const std::string& dir, int rank,
                                 std::vector<tensor_entry> entries,
                                 const std::vector<const std::byte*>& data);

/// The text of a per-rank checkpoint's checkpoint.json: its envelope (checkpoint_json_kind),
/// the step, and the number of rank files.
XSHARD_DECL std::string checkpoint_json(std::int64_t step, int ranks);

/// What a checkpoint.json says.
struct checkpoint_json_contents {
    std::int64_t step = 0;
    std::uint64_t ranks = 0;
};

/// Parses a checkpoint.json strictly (its envelope, a step in [0, INT64_MAX], ranks in
/// [1, INT_MAX]); io_error "xshard: <what is wrong>".
XSHARD_DECL checkpoint_json_contents parse_checkpoint_json(std::string_view text);

/// Completes a per-rank checkpoint written in `tmp` (its rank files complete and synced):
/// writes strategy.json and checkpoint.json, then puts it in place of `path`
/// (replace_checkpoint).
XSHARD_DECL void finish_per_rank(const std::string& tmp, const std::string& path,
                                 const strategy_file& strategy, std::int64_t step,
                                 bool remove_old = true);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/checkpoint_forms.ipp>
#endif
