#pragma once
/// \file
/// What a checkpoint save or load works on: the tensors of a parameter container and of an
/// optimizer's state (under the prefix "optimizer."), each as a tensor_record with its
/// safetensors dtype, the mesh they live on, and the strategy they are saved with.

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/param/tensor_record.hpp>
#include <xshard/param/traversal.hpp>

#include <algorithm>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::detail {

/// The tensors a checkpoint save or load works on (collect_model).
struct ckpt_model {
    std::vector<tensor_record> tensors; ///< param/tensor_record.hpp
    std::vector<std::string> dtypes;    ///< their safetensors dtypes
    const communicator* comm = nullptr;
    mesh_shape mesh;
    int rank = 0;
    strategy_file strategy; ///< of everything saved (parameters, then optimizer state)
    /// Which tensors this rank holds a block of, to write (empty: all). A pipeline's checkpoint
    /// (pipeline/checkpoint.hpp) lists every stage's tensors on every rank, each held by its
    /// stage's ranks only (its record then gives its stage's mesh, layout and shape).
    std::vector<bool> held;

    bool holds(std::size_t i) const { return held.empty() || held[i]; }
};

/// The bytes of this rank's block of `t`.
inline std::size_t local_bytes(const tensor_record& t) {
    return checked_mul(volume(t.extent), t.element);
}

/// Adds the tensor `c` (named `name` in its container, of safetensors `dtype`) to `m`: the
/// part of `collect` that does not depend on the tensor's type.
XSHARD_DECL void add_to_model(ckpt_model& m, tensor_record c, const std::string& name,
                              std::string_view dtype, bool trainable);

/// Adds the tensors of `container` (its trainable ones unless `all`) to `m`, named `prefix`
/// and their names.
template <class C>
void collect(ckpt_model& m, C& container, const std::string& prefix, bool all) {
    for_each_parameter(container, [&](const std::string& name, auto& t, bool trainable) {
        using T = typename std::remove_cvref_t<decltype(t)>::value_type;
        if (trainable || all)
            add_to_model(m, record_of(prefix + name, t, trainable), name, dtype_of<T>().name,
                         trainable);
    });
}

/// Throws xshard::error (the same on every rank: every rank holds the same names) when two
/// tensors of `m` have one name, or one is named like safetensors' metadata entry.
XSHARD_DECL void check_names(const ckpt_model& m);

template <class P, class S>
ckpt_model collect_model(P& params, S& state, bool all) {
    ckpt_model m;
    collect(m, params, "", all);
    collect(m, state, "optimizer.", true);
    if (!m.comm)
        throw error("xshard: checkpoint: nothing to save or load");
    check_names(m);
    return m;
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/checkpoint_model.ipp>
#endif
