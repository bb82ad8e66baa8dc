#pragma once
/// \file
/// One type-erased record of a distributed tensor: what algorithms over a parameter container
/// that treat every tensor alike need (names and layouts, gradient fusion, parameter
/// broadcast, checkpoints, the gradient path's prices): its name, element type, global shape,
/// layout, mesh and its groups, and this rank's block. `parameter_records`
/// (param/traversal.hpp) makes them for a whole container.

#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <typeindex>
#include <vector>

namespace xshard {

/// A distributed tensor as bytes: `data` is this rank's block (contiguous, row-major),
/// writable when the record was made from a non-const tensor (null otherwise); `cdata` is the
/// same block for reading. The tensor (and its mesh) must outlive the record.
struct tensor_record {
    std::string name;
    std::byte* data = nullptr;        ///< this rank's block, writable (null for a const tensor)
    const std::byte* cdata = nullptr; ///< this rank's block, for reading
    std::size_t count = 0;            ///< elements of this rank's block
    std::size_t element = 0;          ///< bytes per element
    std::type_index type = typeid(void);
    MPI_Datatype mpi_type = MPI_DATATYPE_NULL;
    axis_set replicated;                 ///< the axes along which ranks hold identical copies
    const communicator* group = nullptr; ///< the communicator of those ranks
    mesh_shape mesh;
    int mesh_rank = 0;
    const communicator* mesh_comm = nullptr; ///< the whole mesh
    layout lay;                              ///< the layout
    std::vector<std::size_t> shape;          ///< the global shape
    std::vector<std::size_t> offset, extent; ///< this rank's block in global coordinates
    std::vector<std::size_t> local;          ///< the shape of the block the tensor holds
    const communicator* subs = nullptr;      ///< the mesh's groups, by axis set (mesh::sub)
    bool trainable = true;
    std::string problem; ///< what is wrong with it on this rank ("" if nothing)

    /// The bytes of this rank's block.
    std::size_t bytes() const { return count * element; }
    /// The bytes of the whole tensor (checked: throws on overflow).
    std::size_t global_bytes() const { return checked_mul(volume(shape), element); }
    /// The bytes of the block rank `r` holds: every rank can compute it for every rank.
    std::size_t block_bytes(int r) const {
        const auto c = mesh.coords(r);
        std::size_t n = element;
        for (std::size_t d = 0; d < shape.size(); ++d)
            n = checked_mul(n, block_extent(shape[d], std::size_t(lay.split_count(d, mesh)),
                                            std::size_t(lay.block_index(d, mesh, c))),
                            "a block's size");
        return n;
    }
    /// The communicator of this rank's group spanned by `axes` of the mesh (mesh::sub).
    const communicator& sub(axis_set axes) const { return subs[axes.bits]; }
    /// Whether this rank is the first holder of its block (coordinate 0 along the replicated
    /// axes): the one copy of a replicated block that is written or counted once.
    bool primary() const { return mesh.group_rank(mesh_rank, replicated) == 0; }
};

/// The record of tensor `t` named `name`, with its own layout (writable data when `t` is not
/// const).
template <class D>
    requires distributed_tensor<std::remove_const_t<D>>
tensor_record record_of(const std::string& name, D& t, bool trainable = true) {
    using T = typename std::remove_const_t<D>::value_type;
    const auto& mesh = t.mesh();
    const auto b = t.block();
    tensor_record r;
    r.name = name;
    auto& local = t.local();
    if constexpr (!std::is_const_v<D>)
        r.data = reinterpret_cast<std::byte*>(local.data());
    r.cdata = reinterpret_cast<const std::byte*>(local.data());
    r.count = local.size();
    r.element = sizeof(T);
    r.type = typeid(T);
    if constexpr (mpi_datatype<T>)
        r.mpi_type = datatype_of<T>();
    r.lay = t.layout();
    r.replicated = r.lay.replicated_axes(mesh.shape());
    r.subs = &mesh.sub(axis_set{});
    r.group = &r.sub(r.replicated);
    r.mesh = mesh.shape();
    r.mesh_rank = mesh.rank();
    r.mesh_comm = &mesh.comm();
    r.shape.assign(t.shape().begin(), t.shape().end());
    r.offset.assign(b.offset.begin(), b.offset.end());
    r.extent.assign(b.extent.begin(), b.extent.end());
    r.local.assign(local.shape().begin(), local.shape().end());
    r.trainable = trainable;
    return r;
}

} // namespace xshard
