#pragma once
/// \file
/// One point-to-point exchange of a plan's step: the receives posted first, then the sends,
/// the rank's local work (the part of its block it keeps) done while the messages travel,
/// then every message waited for. The one place for the exchanges of redistribution plans
/// (plan.hpp) and of the halo step's forward and adjoint (halo.hpp).

#include <xshard/comm/communicator.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/region_message.hpp>

#include <cstddef>
#include <span>

namespace xshard::detail {

/// Posts `recvs` into `recv_base` and `sends` from `send_base` over `c` with tag `tag`
/// (every message in `batch`, whose slots are reserved: nothing is allocated), runs
/// `local()` while they are in flight, and waits for them all. Returns the bytes sent.
template <class T, class Local>
std::size_t exchange_regions(const communicator& c, message_batch& batch,
                             std::span<const region_message> recvs, T* recv_base,
                             std::span<const region_message> sends, const T* send_base, int tag,
                             Local&& local) {
    for (const auto& m : recvs)
        batch.irecv(c, recv_base + m.offset, m.count, m.type, m.peer, tag);
    std::size_t bytes = 0;
    for (const auto& m : sends) {
        batch.isend(c, send_base + m.offset, m.count, m.type, m.peer, tag);
        bytes += m.elements * sizeof(T);
    }
    local();
    batch.wait_all();
    return bytes;
}

/// An exchange-like step of geometry `geo`: `recvs` (regions of the output block) into
/// `out`, `sends` (regions of the input block) from `in`, tag 0, and the region the rank
/// keeps copied from `in` to `out` meanwhile. Returns the bytes sent.
template <class T, std::size_t N>
std::size_t exchange_step(const communicator& c, message_batch& batch,
                          std::span<const region_message> recvs,
                          std::span<const region_message> sends, const step_geometry<N>& geo,
                          const T* in, T* out) {
    return exchange_regions(c, batch, recvs, out, sends, in, 0, [&] {
        copy_region(in, geo.in_block.extent, geo.in_block.offset, out, geo.out_block.extent,
                    geo.out_block.offset, geo.kept);
    });
}

} // namespace xshard::detail
