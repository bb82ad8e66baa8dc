#pragma once
// The model the checkpoint tests save and load: tensors of several element types, ranks and
// uneven sizes, one non-trainable parameter, and an optimizer state. Every element's value is
// a function of its tensor's name and its global index (`expected_value`), so any rank, and
// tests/io/safetensors_interop.py, can check any block without communication.

#include <xshard/comm/collectives.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/comm/float16.hpp>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <span>
#include <stdexcept>
#include <string>

namespace xshard::testing {

using ckpt_mesh = xshard::mesh<"dp", "mp">;

template <class T, std::size_t N>
using dyn = xshard::dtensor<T, ckpt_mesh, xshard::dynamic_layout(N)>;

/// A small integer identifying a tensor by its name.
inline int tensor_id(const std::string& name) {
    int id = 0;
    for (unsigned char ch : name)
        id += ch;
    return id % 89;
}

/// The value of element `i` (row-major global index) of tensor `name` at training step
/// `step`: exactly representable in every element type used (bfloat16 gets a smaller range).
template <class T>
T expected_value(const std::string& name, std::size_t i, std::int64_t step = 0) {
    const auto k = std::size_t(tensor_id(name)) + std::size_t(step) * 31;
    if constexpr (std::is_same_v<T, xshard::bfloat16>)
        return T(double((i * 7 + k * 13) % 61) * 0.5 - 15);
    else if constexpr (std::is_integral_v<T>)
        return T((i * 7 + k * 13) % 1001) - 500;
    else
        return T(double((i * 7 + k * 13) % 1001) * 0.125 - 50);
}

/// Calls `f(local flat index, global flat index)` for every element of `t`'s block.
template <class D, class F>
void for_each_local(const D& t, F f) {
    const auto b = t.block();
    const auto n = b.size();
    std::array<std::size_t, D::rank> idx{};
    for (std::size_t k = 0; k < n; ++k) {
        std::size_t g = 0;
        for (std::size_t d = 0; d < D::rank; ++d)
            g = g * t.shape()[d] + b.offset[d] + idx[d];
        f(k, g);
        for (std::size_t d = D::rank; d-- > 0;) {
            if (++idx[d] < b.extent[d])
                break;
            idx[d] = 0;
        }
    }
}

/// Fills `t`'s block with the expected values of tensor `name`.
template <class D>
void fill(D& t, const std::string& name, std::int64_t step = 0) {
    using T = typename D::value_type;
    for_each_local(t, [&](std::size_t k, std::size_t g) {
        t.local().data()[k] = expected_value<T>(name, g, step);
    });
}

/// The number of elements of `t`'s block that differ from the expected values.
template <class D>
std::size_t mismatches(const D& t, const std::string& name, std::int64_t step = 0) {
    using T = typename D::value_type;
    std::size_t bad = 0;
    for_each_local(t, [&](std::size_t k, std::size_t g) {
        bad += !(t.local().data()[k] == expected_value<T>(name, g, step));
    });
    return bad;
}

/// The layouts of a model, by parameter name.
using layouts = std::map<std::string, xshard::layout>;

/// The model's tensors, in layouts chosen per name.
struct net {
    dyn<double, 2> w1;
    dyn<float, 2> w2;
    dyn<double, 1> b;
    dyn<double, 3> e;
    dyn<xshard::bfloat16, 2> h;
    xshard::parameter<dyn<std::int32_t, 1>> counts; ///< not trainable

    net(const ckpt_mesh& m, const layouts& l)
        : w1(xshard::zeros<double, xshard::dynamic_layout(2)>(m, {12, 10}, l.at("w1")))
        , w2(xshard::zeros<float, xshard::dynamic_layout(2)>(m, {7, 5}, l.at("w2")))
        , b(xshard::zeros<double, xshard::dynamic_layout(1)>(m, {9}, l.at("b")))
        , e(xshard::zeros<double, xshard::dynamic_layout(3)>(m, {3, 4, 6}, l.at("e")))
        , h(xshard::zeros<xshard::bfloat16, xshard::dynamic_layout(2)>(m, {6, 4}, l.at("h")))
        , counts{"counts",
                 xshard::zeros<std::int32_t, xshard::dynamic_layout(1)>(m, {10}, l.at("counts")),
                 std::nullopt, false} {}

    friend void visit_parameters(net& n, auto&& visit) {
        visit("w1", n.w1);
        visit("w2", n.w2);
        visit("b", n.b);
        visit("e", n.e);
        visit("h", n.h);
        visit("counts", n.counts);
    }

    /// Fills every tensor with its expected values at `step`.
    void fill_all(std::int64_t step = 0) {
        fill(w1, "w1", step);
        fill(w2, "w2", step);
        fill(b, "b", step);
        fill(e, "e", step);
        fill(h, "h", step);
        fill(counts.value, "counts", step);
    }
    /// Elements that differ from the expected values at `step` (counts only if `with_counts`).
    std::size_t mismatches_all(std::int64_t step = 0, bool with_counts = true) const {
        return mismatches(w1, "w1", step) + mismatches(w2, "w2", step) + mismatches(b, "b", step) +
               mismatches(e, "e", step) + mismatches(h, "h", step) +
               (with_counts ? mismatches(counts.value, "counts", step) : 0);
    }
};

/// An optimizer state: momentum for w1 and w2 (named as a checkpoint stores them, under
/// "optimizer.").
struct momentum {
    std::map<std::string, dyn<double, 2>> w1;
    std::map<std::string, dyn<float, 2>> w2;

    momentum(const ckpt_mesh& m, const xshard::layout& l1, const xshard::layout& l2)
        : w1{{"w1", xshard::zeros<double, xshard::dynamic_layout(2)>(m, {12, 10}, l1)}}
        , w2{{"w2", xshard::zeros<float, xshard::dynamic_layout(2)>(m, {7, 5}, l2)}} {}

    friend void visit_parameters(momentum& s, auto&& visit) {
        visit("momentum", s.w1);
        visit("momentum", s.w2);
    }
    void fill_all(std::int64_t step = 0) {
        fill(w1.at("w1"), "optimizer.momentum.w1", step);
        fill(w2.at("w2"), "optimizer.momentum.w2", step);
    }
    std::size_t mismatches_all(std::int64_t step = 0) const {
        return mismatches(w1.at("w1"), "optimizer.momentum.w1", step) +
               mismatches(w2.at("w2"), "optimizer.momentum.w2", step);
    }
};

/// The layouts checkpoints are saved with on the 2x2 mesh, and others to load them into.
inline const layouts saved_layouts{{"w1", "[dp, mp]"}, {"w2", "[mp, -]"},
                                   {"b", "[-]"},       {"e", "[-, (dp, mp), -]"},
                                   {"h", "[-, mp]"},   {"counts", "[dp]"}};
inline const layouts other_layouts{{"w1", "[mp, dp]"},     {"w2", "[-, (dp, mp)]"},
                                   {"b", "[(mp, dp)]"},    {"e", "[dp, -, mp]"},
                                   {"h", "[(dp, mp), -]"}, {"counts", "[-]"}};

} // namespace xshard::testing
