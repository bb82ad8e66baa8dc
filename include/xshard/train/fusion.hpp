#pragma once
/// \file
/// What parameter broadcast and gradient synchronisation see of a parameter container: one
/// record per parameter (its local shard as bytes, its element type, the group of ranks
/// holding identical copies), and fusion into buckets: small parameters that travel together
/// are packed into one buffer so that one collective moves them all.

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/float16.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/param/tensor_record.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/train/buckets.hpp>

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <typeindex>
#include <vector>

namespace xshard {

/// Fusion of one kind of collective (MindSpore's comm_fusion): `size` fills buckets up to
/// `threshold_mib` (0: every parameter on its own); `automatic` (the default) lets xshard
/// choose: 4 MiB, buckets that stay in cache while they are packed, reduced and unpacked
/// (bench_parameters measures it against MindSpore's 64 MB default: benchmarks/README.md);
/// `index` (all-reduce only, MindSpore's all_reduce_fusion_config) closes a bucket before each
/// parameter index of `indices` (strictly increasing, in the container's order), whatever the
/// sizes.
struct fusion_threshold {
    enum class mode { automatic, size, index } how = mode::automatic;
    double threshold_mib = 64;
    std::vector<std::size_t> indices = {};

    /// The bucket limit in bytes (`index`: none).
    std::size_t bytes() const {
        if (how == mode::index)
            return std::numeric_limits<std::size_t>::max() / 4;
        return how == mode::automatic ? std::size_t(4) << 20
                                      : std::size_t(threshold_mib * double(1 << 20));
    }

    /// `index` mode: which segment parameter `i` falls in (0 otherwise).
    std::size_t segment(std::size_t i) const {
        if (how != mode::index)
            return 0;
        return std::size_t(std::upper_bound(indices.begin(), indices.end(), i) - indices.begin());
    }

    /// What is wrong with the settings for `n` parameters, if anything.
    std::optional<std::string> problem(std::size_t n) const;
};

namespace detail {

/// One parameter's local shard, type-erased (param/tensor_record.hpp).
using param_ref = tensor_record;

/// Gives each record the layout that `layouts` names for it, if any, and the group of its
/// replicas under that layout, and records what is wrong: a layout that does not fit the mesh
/// or the tensor, a shard that its layout does not give this rank, or a name in `layouts`
/// that no record has (in the last record). The part of param_refs that does not depend on
/// the tensors' types.
XSHARD_DECL void take_layouts(std::vector<param_ref>& refs, const layout_dict* layouts);

/// The records of every parameter of a container (a tensor's mesh must outlive them). A
/// parameter named in `layouts` takes its redundancy from that layout instead of its own; a
/// name there that no parameter has, a layout that does not fit the mesh, or a shard whose
/// shape contradicts its layout is recorded as a problem (in the last record for names the
/// container does not have).
template <parameter_container C>
std::vector<param_ref> param_refs(C& c, const layout_dict* layouts = nullptr) {
    auto refs = parameter_records(c);
    take_layouts(refs, layouts);
    return refs;
}

/// The first problem of the records, or of their meshes (the parameters of one call must
/// share a mesh).
XSHARD_DECL std::optional<std::string> first_problem(const std::vector<param_ref>& refs);

/// Groups the records `chosen` into buckets by their bytes (train/buckets.hpp): one list per
/// key (parameters of different keys never share a bucket), each bucket closed when adding a
/// parameter would pass `limit` bytes (0: one parameter per bucket), in the order of `chosen`
/// within a key and keys in order.
template <class Key, class KeyOf>
std::vector<bucket> make_buckets(const std::vector<param_ref>& refs,
                                 const std::vector<std::size_t>& chosen, std::size_t limit,
                                 KeyOf key_of) {
    return fill_buckets<Key>(
        chosen, limit, [&](std::size_t i) { return refs[i].bytes(); }, key_of);
}

/// One MPI datatype covering the members of `b` where they lie in memory (an hindexed type
/// on MPI_BOTTOM): a fused collective without a pack buffer. Every rank's type has the same
/// signature (the same element type and counts, in order).
XSHARD_DECL derived_datatype fused_datatype(const std::vector<param_ref>& refs, const bucket& b);

/// Packs the members of `b` into `buffer` (or unpacks them from it).
XSHARD_DECL void pack(const std::vector<param_ref>& refs, const bucket& b, std::byte* buffer);
XSHARD_DECL void unpack(const std::vector<param_ref>& refs, const bucket& b,
                        const std::byte* buffer);

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/fusion.ipp>
#endif
