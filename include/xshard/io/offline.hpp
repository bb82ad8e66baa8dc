#pragma once
/// \file
/// Checkpoints offline, in one process without MPI: verify one, merge a per-rank checkpoint
/// into one integrated file, reshard one into another strategy. What `xshard-ckpt` does, as
/// library functions. Nothing is ever held whole: merge streams slabs of rows, reshard one
/// destination block at a time, and both first check every stored byte they use against its
/// checksum. Outputs are written under exclusive temporary names, fsynced and renamed into
/// place; they replace only checkpoints (never a user's file or directory, never through a
/// link). Errors are io_error naming the path.

#include <xshard/compiled.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/checkpoint_forms.hpp>
#include <xshard/io/checkpoint_reader.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/staged_save.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/io/strategy_file.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xshard {

/// What verify_checkpoint found.
struct checkpoint_report {
    std::size_t files = 0;     ///< files of stored blocks
    std::size_t checked = 0;   ///< tensor blocks checked against a checksum
    std::size_t unchecked = 0; ///< tensor blocks without a checksum
    /// One line per damage: a block missing or not stored as the strategy says, a checksum
    /// mismatch ("checksum mismatch: w2 in dir/rank_1.safetensors").
    std::vector<std::string> damage;
};

/// The number of bytes of tensor `e` (checked: throws on overflow).
inline std::size_t stored_bytes(const strategy_entry& e) {
    return checked_mul(volume(e.shape), dtype_size(e.dtype), "a tensor's size");
}

/// Checks everything a load of the checkpoint at `path` needs: every stored block of every
/// tensor of its strategy in its file, with its shape and dtype, and every stored tensor
/// block against its CRC-32. Throws io_error only when `path` is not a checkpoint at all.
XSHARD_DECL checkpoint_report verify_checkpoint(const std::string& path);

namespace detail {

/// Checks every stored byte of `tensors` (their blocks first) against its CRC-32, in
/// 16 MiB pieces; throws io_error naming the damaged tensors.
XSHARD_DECL void verify_stored(const checkpoint_reader& r,
                               const std::vector<strategy_entry>& tensors);

} // namespace detail

/// Writes the checkpoint at `path` (either form) as one integrated safetensors file `out`
/// (replacing a checkpoint there, nothing else). Returns the number of tensors.
XSHARD_DECL std::size_t merge_checkpoint(const std::string& path, const std::string& out);

/// Writes the checkpoint at `path` (either form) as a per-rank checkpoint `out` in the
/// strategy of `target` (any mesh: one file per rank of its mesh), which must give a layout
/// for every tensor of the checkpoint, with the same shape and dtype. Replaces a checkpoint
/// at `out`, nothing else. Returns the number of tensors.
XSHARD_DECL std::size_t reshard_checkpoint(const std::string& path, const strategy_file& target,
                                           const std::string& out,
                                           const std::string& target_name = "the target strategy");

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/offline.ipp>
#endif
