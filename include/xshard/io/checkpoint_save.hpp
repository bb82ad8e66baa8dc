#pragma once
/// \file
/// The collective saves of both forms (checkpoint.hpp's save_checkpoint), each a staged save
/// (staged_save.hpp). Integrated: each rank writes its own blocks in place in the one file,
/// checksumming them as it goes, the ranks of a node together where a tensor is stored in
/// short runs (node_io.hpp); rank 0 writes the header with the checksums; the file is read
/// back against them (check_written) before it replaces the previous checkpoint. Per-rank:
/// each rank writes its own file (checkpoint_forms.hpp's write_rank_file), then rank 0 the
/// directory's JSON files, and the directory replaces the previous one.

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/checkpoint_forms.hpp>
#include <xshard/io/checkpoint_model.hpp>
#include <xshard/io/collective_verify.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/node_io.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/staged_save.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/param/tensor_record.hpp>

#include <zlib.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard::detail {

/// Writes the block of `t` into the file of `w` (which stores the tensor whole, row-major,
/// from byte `at`): each contiguous run in the file (runs_of) is checksummed as it is stored
/// and recorded in `out` as a piece of tensor `key`; short runs go through the mapping, after
/// the bytes from the first run to the last are reserved (mapped_writer.hpp). Returns the
/// CRC-32 of the block (its bytes in its own row-major order: the runs in turn).
XSHARD_DECL std::uint32_t write_block(mapped_writer& w, std::size_t at, const tensor_record& t,
                                      std::uint64_t key, std::vector<crc_run>& out);

/// Writes a tensor of `length` bytes into `f` (which stores it whole, row-major, from byte
/// `at`) with the other ranks of the node (node_io.hpp), each rank its block: its `runs`
/// (runs_of: offsets in the tensor, lengths; none if it writes none), whose bytes are one
/// after the other at `data`. The blocks the ranks write must partition the tensor. Each run
/// is checksummed as write_block does and recorded in `out` as a piece of tensor `key`.
/// Returns the block's CRC-32. Collective over the node's ranks.
XSHARD_DECL std::uint32_t
write_together(node_file_io& node, const file& f, std::size_t at, std::size_t length,
               const std::vector<std::pair<std::size_t, std::size_t>>& runs, const std::byte* data,
               std::uint64_t key, std::vector<crc_run>& out);

/// How the ranks write the tensors of an integrated save: each tensor's bytes, the runs of
/// this rank's block in it (runs_of; none where it writes none), and whether the node's
/// ranks write it together (write_together) through `node`.
struct integrated_writes {
    std::vector<std::uint64_t> sizes;
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> mine;
    std::vector<bool> together;
    node_file_io* node = nullptr;
};

/// Plans the writes of `m`: each rank writes its own blocks (one copy of a replicated block:
/// its primary holder's); tensors stored in short runs (column splits) the node's ranks write
/// together when they share a node and their blocks partition the tensor (the same answer on
/// every rank: one all-reduce of each rank's view). Collective.
XSHARD_DECL integrated_writes plan_integrated_writes(const communicator& c, const ckpt_model& m);

/// Writes this rank's blocks of `m` into the integrated file `tmp`, whose data starts at
/// byte `data_start` (the tensors at their `entries`' offsets), as planned by `w`,
/// checksumming them as it goes: the pieces of each tensor go to `runs` (for its CRC
/// whole), each block whole to `blocks` (for loads: as a run of tensor i at the block's
/// index among the tensor's stored blocks). Collective.
XSHARD_DECL void write_integrated_blocks(const communicator& c, const ckpt_model& m,
                                         const std::string& tmp, std::size_t data_start,
                                         const std::vector<tensor_entry>& entries,
                                         const integrated_writes& w, std::vector<crc_run>& runs,
                                         std::vector<crc_run>& blocks);

/// Saves `m` as an integrated checkpoint (see the file comment): a staged save of one file.
/// Collective over `m.comm`, each rank writing the primary blocks of the tensors it holds
/// (ckpt_model::held).
XSHARD_DECL void save_integrated(ckpt_model& m, const std::string& path, std::int64_t step);

/// Saves `m` as a per-rank checkpoint: a staged save of a directory, each rank writing its
/// own file. Collective over `m.comm`.
XSHARD_DECL void save_per_rank(ckpt_model& m, const std::string& path, std::int64_t step);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/checkpoint_save.ipp>
#endif
