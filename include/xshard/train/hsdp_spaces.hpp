#pragma once
/// \file
/// Where optimizer sharding's state lives (train/hsdp.hpp): space 0 is the weights' mesh;
/// space s > 0 is the mesh of this rank's copy under a cut of mesh axes into copies
/// (hsdp_group's `parts`, train/hsdp_group.hpp), made once per cut, with the communicator of
/// the ranks at this rank's place in every copy (which sums a block over the copies).

#include <xshard/comm/communicator.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/train/hsdp_group.hpp>

#include <array>
#include <cstddef>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

namespace xshard::detail {

/// The meshes sharded state lives on (see the file comment). Kept in place: entries and
/// plans point into it.
class hsdp_spaces {
public:
    hsdp_spaces() = default;
    hsdp_spaces(const hsdp_spaces&) = delete;
    hsdp_spaces& operator=(const hsdp_spaces&) = delete;

    /// Sets space 0: the weights' mesh, by its communicator and shape.
    void set_weights_mesh(const communicator& comm, const mesh_shape& shape) {
        comm_ = &comm;
        shape_ = shape;
    }

    /// The space (>= 1) of the copy mesh that cuts `mesh` into copies by `parts`, made on
    /// first use (collective over the mesh: two splits and the copy mesh's construction;
    /// every rank asks for the same ones in the same order).
    template <class Mesh>
    int refine(const Mesh& mesh, const std::vector<std::pair<int, int>>& parts) {
        for (std::size_t i = 0; i < refinements_.size(); ++i)
            if (refinements_[i].parts == parts)
                return int(i) + 1;
        const auto copy = hsdp_copy_of(mesh.shape(), mesh.shape().coords(mesh.rank()), parts);
        const int sub_rank = copy.shape.rank_of(copy.coords);
        const communicator part = mesh.comm().split(copy.outer, sub_rank);
        std::array<int, Mesh::ndim> sizes{};
        for (std::size_t i = 0; i < Mesh::ndim; ++i)
            sizes[i] = copy.shape.sizes[i];
        auto m = std::make_shared<Mesh>(part, sizes);
        refinement r;
        r.parts = parts;
        r.comm = &m->comm();
        r.shape = m->shape();
        r.mesh = std::move(m);
        r.across = mesh.comm().split(sub_rank, copy.outer);
        refinements_.push_back(std::move(r));
        return int(refinements_.size());
    }

    /// The mesh of `space`: `weights_mesh` for 0, else the copy mesh (of the same type).
    template <class Mesh>
    const Mesh& mesh(int space, const Mesh& weights_mesh) const {
        if (space == 0)
            return weights_mesh;
        return *static_cast<const Mesh*>(at(space).mesh.get());
    }

    /// The communicator of the ranks at this rank's place in every copy of `space`; none for
    /// space 0.
    const communicator* across(int space) const { return space == 0 ? nullptr : &at(space).across; }

    /// The communicator of the mesh of `space`.
    const communicator& comm(int space) const { return space == 0 ? *comm_ : *at(space).comm; }

    /// The shape of the mesh of `space`.
    const mesh_shape& shape(int space) const { return space == 0 ? shape_ : at(space).shape; }

private:
    /// A cut of mesh axes into copies: the mesh of this rank's copy (the weights' mesh type,
    /// each part's axis of its `inner` size; type-erased) and the communicator of the ranks at
    /// this rank's place in every copy.
    struct refinement {
        std::vector<std::pair<int, int>> parts;
        std::shared_ptr<void> mesh;
        const communicator* comm = nullptr; ///< the copy mesh's, for the batch plans
        mesh_shape shape;
        communicator across;
    };

    const refinement& at(int space) const { return refinements_[std::size_t(space) - 1]; }

    const communicator* comm_ = nullptr; ///< the weights' mesh's
    mesh_shape shape_{};
    std::deque<refinement> refinements_; ///< space s is refinements_[s - 1]
};

} // namespace xshard::detail
