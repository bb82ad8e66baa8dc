#pragma once
/// \file
/// Where optimizer sharding (hsdp) puts a weight's data-parallel axes: the layout that
/// train/hsdp.hpp shards a weight's state to, and that search/cost.hpp prices. One rule, so that
/// the search prices the layout that runs.

#include <xshard/compiled.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>

#include <cstddef>
#include <span>

namespace xshard {

/// The sharded layout of a tensor laid out as `value` with global `shape`: the mesh axes
/// `axes` (which `value` must not use) appended, in mesh order, to the axes of the dimension
/// whose block (the product over dimensions of the largest pieces) then comes out smallest
/// (the lowest such dimension). `value` itself when `axes` is empty or the tensor has rank 0.
/// No communication.
XSHARD_DECL layout sharded_layout(const layout& value, const mesh_shape& mesh,
                                  std::span<const std::size_t> shape, axis_set axes);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/core/sharded_layout.ipp>
#endif
