#pragma once
/// \file
/// The collective load (checkpoint.hpp's load_checkpoint): a checkpoint of either form read
/// into any strategy, every stored byte it loads checked against its CRC-32 before anything
/// is written, so that a load changes all of the model or nothing (see load).

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/io/checkpoint_model.hpp>
#include <xshard/io/checkpoint_reader.hpp>
#include <xshard/io/collective_verify.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/node_io.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/param/tensor_record.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// What a load found.
struct checkpoint_info {
    std::int64_t step = 0;
    checkpoint_format format = checkpoint_format::integrated;
    strategy_file strategy; ///< the strategy the checkpoint was saved with
};

namespace detail {

/// Whether stored block `b` lies inside one block of `t`'s layout (that of the load): then a
/// rank that needs any of its bytes needs them all, and reads and verifies it whole.
XSHARD_DECL bool inside_one_block(const tensor_record& t, const stored_block& b);

/// Whether stored block `b` holds bytes of this rank's block of `t`.
XSHARD_DECL bool meets(const tensor_record& t, const stored_block& b);

/// Whether the ranks read stored blocks `bs` of tensor `t` together (node_io.hpp): in the
/// integrated form, when each lies inside one block of the load's layout and is stored in
/// short runs (a column split), which a rank alone copies out of a mapping of the file. The
/// same answer on every rank (it depends on the strategy and the model's layout only).
XSHARD_DECL bool read_on_node(const checkpoint_reader& r, const strategy_entry& e,
                              const tensor_record& t, const std::vector<stored_block>& bs);

/// Reads the blocks `plan` lists into `out` with the other ranks of the node (node_io.hpp).
/// When no other rank needs these bytes (`plan.direct`), the parts of the runs in this rank's
/// slice of a window are read straight into `out`, and only the rest is copied out of the
/// window. Collective over the node reader's ranks, each with its own plan of the same tensor.
XSHARD_DECL void read_together(node_file_io& node, const checkpoint_reader::node_read& plan,
                               std::byte* out);

/// What a load reads, planned before anything is read: for each tensor of the model, its
/// entry in the checkpoint's strategy and its stored blocks; the tensors the node's ranks
/// read together (read_together) through `node`, with this rank's part of each read.
struct load_plan {
    std::vector<const strategy_entry*> stored;
    std::vector<std::vector<stored_block>> blocks;
    std::vector<std::optional<checkpoint_reader::node_read>> together;
    node_file_io* node = nullptr;
};

/// Throws (io_error, or xshard::error for a const tensor) unless every tensor of `m` is in
/// `r` with its dtype and shape; sets `stored` to their entries. `where` names the load.
XSHARD_DECL void check_stored(const ckpt_model& m, const checkpoint_reader& r,
                              const std::string& where, std::vector<const strategy_entry*>& stored);

/// Plans the load of `m` from `r` (load_plan), checking first that the checkpoint matches the
/// model (check_stored). Every file the load reads is opened here (its header parsed, every
/// block checked to be stored as the strategy says), before any data is read; then the ranks
/// check that they opened one checkpoint (check_same_file) and, where the node's ranks read
/// tensors together, which of those reads go straight into the ranks' tensors. Collective.
XSHARD_DECL load_plan plan_load(ckpt_model& m, const checkpoint_reader& r,
                                const std::string& where);

/// Reads into `m` what this rank needs of `r` as `p` plans, checking nothing (the load has
/// verified the stored bytes first): the node's reads first, all of them on every rank, then
/// this rank's own, a stored block inside one block of the load's layout read whole, any
/// other one in part. Collective over the node's ranks where `p` has node reads.
XSHARD_DECL void read_stored(ckpt_model& m, const checkpoint_reader& r, const load_plan& p);

/// Loads the blocks of `m` from `r`, all of them or none: nothing of the model changes
/// unless every stored byte the load reads matches its CRC-32.
///  * First the shapes, dtypes and presence of every tensor are checked, and every file the
///    load reads is opened and its header parsed (plan_load); the ranks check that they
///    opened one file, so a save renamed over the checkpoint meanwhile is never read.
///  * Then every stored block of the model's tensors is verified, each byte by one rank
///    (verify_shared: a contiguous share of the files per rank, in large pieces, each read or
///    seen through a mapping, whichever is faster). A mismatch raises io_error on every rank,
///    naming the damaged tensors, before anything is written.
///  * Then each rank reads what it needs straight into the model: a stored block inside one
///    block of the load's layout whole, in short runs (a column split) from the node's
///    shared windows where the ranks share a node (read_together), any other in part.
/// The second read of each byte comes from the page cache the first one filled. A read that
/// fails in the last step (a device error, the file truncated by another process meanwhile)
/// raises io_error and leaves the model's values unspecified. Collective.
XSHARD_DECL checkpoint_info load(ckpt_model& m, const checkpoint_reader& r);

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/checkpoint_load.ipp>
#endif
