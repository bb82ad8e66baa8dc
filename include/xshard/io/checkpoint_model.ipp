#pragma once
/// \file
/// The definitions of what io/checkpoint_model.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/checkpoint_model.hpp>

namespace xshard::detail {

XSHARD_DECL void add_to_model(ckpt_model& m, tensor_record c, const std::string& name,
                              std::string_view dtype, bool trainable) {
    if (c.lay.is_partial())
        throw error("xshard: checkpoint: '" + name + "' is partial " + c.lay.to_string() +
                    "; resolve it before saving");
    // A tensor on a mesh of part of the ranks, one of copies of it that tile the mesh
    // (hsdp's state sharded over part of a mesh axis, train/hsdp.hpp), is saved with its
    // own mesh, by the copy holding the mesh's rank 0, and loaded by every copy.
    std::optional<mesh_shape> own;
    std::vector<int> ranks;
    bool writes = true;
    if (m.comm && c.mesh_comm->size() != m.comm->size()) {
        if (c.mesh_comm->size() > m.comm->size() || m.comm->size() % c.mesh_comm->size() != 0)
            throw error("xshard: checkpoint: '" + name + "' lives on a mesh of " +
                        std::to_string(c.mesh_comm->size()) +
                        " ranks, the tensors before it on " + std::to_string(m.comm->size()) +
                        "; a checkpoint saves the tensors of one mesh, or of copies of "
                        "a part of it");
        own = c.mesh;
        // The ranks of the copy holding rank 0, in its mesh's order, known everywhere.
        const int me = m.comm->rank();
        ranks.resize(std::size_t(c.mesh_comm->size()));
        mpi::allgather(*c.mesh_comm, std::span(&me, 1), ranks);
        writes = std::ranges::min(ranks) == 0;
        mpi::bcast(*m.comm, ranks, 0);
    } else {
        m.comm = c.mesh_comm;
        m.mesh = c.mesh;
        m.rank = c.mesh_rank;
        m.strategy.mesh = c.mesh;
    }
    m.dtypes.emplace_back(dtype);
    m.strategy.parameters.push_back(
        {c.name, c.shape, m.dtypes.back(), c.lay, trainable, -1, own, std::move(ranks)});
    m.held.push_back(writes);
    m.tensors.push_back(std::move(c));
}

XSHARD_DECL void check_names(const ckpt_model& m) {
    std::set<std::string_view> seen;
    for (const auto& t : m.tensors) {
        if (t.name == "__metadata__")
            throw error("xshard: checkpoint: a parameter is named '__metadata__', which "
                        "safetensors reserves");
        if (!seen.insert(t.name).second)
            throw error("xshard: checkpoint: two parameters are named '" + printable(t.name) +
                        "'; checkpoint names must be unique");
    }
}

} // namespace xshard::detail

