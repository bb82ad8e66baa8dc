#pragma once
/// \file
/// Turning a distributed tensor back into a global array.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <xtensor/xtensor.hpp>

#include <vector>

namespace xshard {

/// The global array on rank `root`, an empty array (extents 0) elsewhere. A partial tensor
/// is reduced first (over its partial axes, onto the first rank of each group). Each
/// distinct block then travels once, from its first holder straight into place in the
/// root's array (MPI subarray datatypes). Collective over the mesh.
template <distributed_tensor D>
auto gather(const D& t, int root = 0) {
    using T = typename D::value_type;
    constexpr std::size_t N = D::rank;
    const auto& lay = t.layout();
    const auto& mesh = t.mesh();
    const auto& comm = mesh.comm();
    const auto& ms = mesh.shape();
    if (root < 0 || root >= comm.size())
        throw error("xshard: gather: root " + std::to_string(root) + " is not a rank of the mesh");

    const T* send = t.local().data();
    std::vector<T> reduced;
    if (lay.is_partial()) {
        if constexpr (summable<T>) {
            const auto& partial = mesh.sub(lay.partial_axes(ms));
            if (partial.rank() == 0)
                reduced.resize(t.local().size());
            reduce(partial, std::span(t.local().data(), t.local().size()), reduced, lay.op, 0);
            send = reduced.data();
        } else {
            throw error("xshard: gather: MPI cannot reduce this element type: resolve the "
                        "partial tensor first (xshard::ops::resolve)");
        }
    }

    const auto spread = detail::spread_axes(lay, ms);
    xt::xtensor<T, N> result;
    message_batch pending;
    std::vector<derived_datatype> types;
    if (comm.rank() == root) {
        result = xt::xtensor<T, N>::from_shape(t.shape());
        for (int r = 0; r < comm.size(); ++r) {
            const auto b = t.block(r);
            if (ms.group_rank(r, spread) != 0 || b.empty())
                continue;
            types.push_back(detail::box_datatype<T>(t.shape(), b));
            pending.irecv(comm, result.data(), 1, types.back().native(), r, 1);
        }
    }
    request sent;
    if (ms.group_rank(comm.rank(), spread) == 0 && !t.block().empty())
        sent = isend(comm, std::span(send, t.local().size()), root, 1);
    pending.wait_all();
    sent.wait();
    return result;
}

/// The global array on every rank (gather to rank 0, then broadcast). Collective.
template <distributed_tensor D>
auto gather_all(const D& t) {
    auto result = gather(t, 0);
    if (t.mesh().rank() != 0)
        result = xt::xtensor<typename D::value_type, D::rank>::from_shape(t.shape());
    bcast(t.mesh().comm(), std::span(result.data(), result.size()), 0);
    return result;
}

} // namespace xshard
