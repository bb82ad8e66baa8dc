#pragma once
/// \file
/// The definitions of what comm/node_slots.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/node_slots.hpp>

namespace xshard::detail {

XSHARD_DECL node_slots::node_slots(const communicator& c)
    : control_(c, slot_bytes)
    , slots_(std::size_t(c.size()))
    , in_(std::size_t(c.size()))
    , out_(std::size_t(c.size()))
    , me_(c.rank()) {}

} // namespace xshard::detail
