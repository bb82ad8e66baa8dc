#pragma once
/// The messages of a plan's point-to-point exchanges: a box of a local block described as
/// one MPI message, with the datatypes it needs kept alive by the plan (the one place for
/// plan.hpp's exchanges, the halo step and cross-mesh plans).

#include <xshard/comm/datatype.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/redistribute/copy.hpp>

#include <array>
#include <climits>
#include <cstddef>
#include <utility>
#include <vector>

namespace xshard::detail {

/// A message: `count` items of `type` at element `offset` of its buffer, `elements` values
/// in all, to or from `peer`.
struct region_message {
    int peer;
    std::size_t offset;
    int count;
    MPI_Datatype type;
    std::size_t elements;
};

/// Describes regions as messages of elements `T`, owning the derived datatypes (a plan keeps
/// one for its lifetime). Communication: none.
template <class T>
class region_types {
public:
    /// `elements` contiguous values at element `offset`: a plain count, or one item of a
    /// derived contiguous type beyond an int count (large-count safe).
    region_message contiguous(int peer, std::size_t offset, std::size_t elements) {
        region_message m{peer, offset, 1, datatype_of<T>(), elements};
        if (elements <= std::size_t(INT_MAX))
            m.count = int(elements);
        else
            m.type = keep(derived_datatype::contiguous_large(elements, datatype_of<T>()));
        return m;
    }

    /// `region` inside `block` of a local buffer: contiguous when the region is one run of
    /// the block, an MPI subarray datatype at offset 0 otherwise.
    template <std::size_t N>
    region_message region(int peer, const box<N>& block, const box<N>& region) {
        if (is_contiguous_in(block.extent, region))
            return contiguous(peer, offset_in(block.extent, block.offset, region), region.size());
        box<N> relative = region;
        for (std::size_t d = 0; d < N; ++d)
            relative.offset[d] -= block.offset[d];
        return {peer, 0, 1, keep(box_datatype<T>(block.extent, relative)), region.size()};
    }

private:
    MPI_Datatype keep(derived_datatype t) {
        types_.push_back(std::move(t));
        return types_.back().native();
    }

    std::vector<derived_datatype> types_;
};

} // namespace xshard::detail
