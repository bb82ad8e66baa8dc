#pragma once
/// \file
/// Elementwise primitives: the binary add, sub, mul, div, maximum and minimum with numpy
/// broadcasting, and the unary neg, relu, gelu, exp, log, tanh, sigmoid, abs, sqrt, square,
/// scale (c x, attribute reals[0] = c) and add_scalar (x + c).
///
/// Sharding: each result dimension is split like the first operand that has it at full
/// extent and asks for a split (an axis already taken by an earlier dimension is not used
/// twice); every operand takes that split, and a dimension it broadcasts from extent 1 stays
/// whole. No communication. VJPs: the local derivative times the cotangent, summed over the
/// dimensions an operand broadcasts (each rank's sum is its term of the operand's cotangent,
/// which is laid out as the dual of the operand's layout).

#include <xshard/compiled.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/graph/primitive.hpp>

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace xshard::detail {

/// The numpy broadcast of the operands' shapes; throws std::invalid_argument when they do not
/// broadcast.
XSHARD_DECL value_shape broadcast_shape(std::span<const operand_type> ops);

XSHARD_DECL std::vector<result_spec> infer_elementwise(const op_attributes&,
                                                       std::span<const operand_type> ops);

/// The broadcast sharding rule (see the file comment).
XSHARD_DECL layout_choice broadcast_rule(const op_attributes&, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape&);

/// Operand i's first dimension is a batch dimension when it is the result's (not broadcast).
XSHARD_DECL bool broadcast_batched(const op_attributes&, std::span<const operand_type> ops,
                                   std::size_t i);

inline double elementwise_flops(const op_attributes&, std::span<const shard_type>,
                                std::span<const shard_type> results) {
    return double(results[0].count());
}

/// Walks the result's local index space in row-major order with the offsets of K operands
/// broadcast against it (stride 0 along the dimensions an operand broadcasts), calling
/// `f(out_offset, offsets, n)` for each run of `n` elements of the last dimension (within a
/// run operand k steps by `step(k)`: 0 or 1). Allocates nothing.
template <std::size_t K>
struct broadcast_walk {
    std::size_t rank = 0;
    std::array<std::size_t, max_tensor_rank> extent{};
    std::array<std::array<std::size_t, max_tensor_rank>, K> stride{};

    broadcast_walk(const value_shape& out, const std::array<const value_shape*, K>& operands)
        : rank(out.size()) {
        for (std::size_t d = 0; d < rank; ++d)
            extent[d] = out[d];
        for (std::size_t k = 0; k < K; ++k) {
            const auto& x = *operands[k];
            std::size_t step = 1;
            for (std::size_t i = 0; i < x.size(); ++i) {
                const std::size_t d = rank - 1 - i, e = x[x.size() - 1 - i];
                stride[k][d] = (e == 1 && out[d] != 1) ? 0 : step;
                step *= e;
            }
        }
        // Dimension d merges into d + 1 where every operand steps across it as one run (the
        // same shapes make one run of every element).
        if (rank < 2)
            return;
        std::size_t kept = rank - 1;
        for (std::size_t d = rank - 1; d-- > 0;) {
            bool merges = true;
            for (std::size_t k = 0; k < K; ++k)
                merges = merges && stride[k][d] == stride[k][kept] * extent[kept];
            if (merges) {
                extent[kept] *= extent[d];
                continue;
            }
            --kept;
            extent[kept] = extent[d];
            for (std::size_t k = 0; k < K; ++k)
                stride[k][kept] = stride[k][d];
        }
        // Dimensions kept..rank-1 remain: move them to the front.
        const std::size_t left = rank - kept;
        for (std::size_t d = 0; d < left; ++d) {
            extent[d] = extent[kept + d];
            for (std::size_t k = 0; k < K; ++k)
                stride[k][d] = stride[k][kept + d];
        }
        rank = left;
    }

    std::size_t step(std::size_t k) const { return rank == 0 ? 0 : stride[k][rank - 1]; }

    template <class F>
    void run(F&& f) const {
        std::array<std::size_t, K> at{};
        if (rank == 0) {
            f(std::size_t(0), at, std::size_t(1));
            return;
        }
        std::size_t total = 1;
        for (std::size_t d = 0; d < rank; ++d)
            total *= extent[d];
        if (total == 0)
            return;
        const std::size_t n = extent[rank - 1];
        std::array<std::size_t, max_tensor_rank> idx{};
        for (std::size_t o = 0; o < total; o += n) {
            f(o, at, n);
            for (std::size_t d = rank - 1; d-- > 0;) {
                ++idx[d];
                for (std::size_t k = 0; k < K; ++k)
                    at[k] += stride[k][d];
                if (idx[d] < extent[d])
                    break;
                for (std::size_t k = 0; k < K; ++k)
                    at[k] -= stride[k][d] * extent[d];
                idx[d] = 0;
            }
        }
    }
};

/// One input of `map_run`: element j is `p[j * step]`, step 1 (contiguous) or 0 (one value
/// broadcast).
template <class T>
struct lane {
    const T* p;
    std::size_t step;
};

/// `a` where `c` holds, else `b`: a select for xsimd's batches, a conditional for scalars.
template <class C, class V>
V choose(const C& c, const V& a, const V& b) {
    if constexpr (std::is_same_v<C, bool>)
        return c ? a : b;
    else
        return xsimd::select(c, a, b);
}

/// out[j] = f(in[j]...) for j < n, or out[j] += f(in[j]...) with `add`. `f` is generic: it
/// takes and returns T or xsimd::batch<T> alike (xsimd's functions and `choose`), so that
/// float and double run in the widest vectors the build targets and without branches (a
/// data-dependent branch per element costs more than the arithmetic). The last partial batch
/// runs through a staging batch too, so every element takes the same arithmetic wherever a
/// shard boundary puts it.
template <class T, class F, class... L>
void map_run(T* out, std::size_t n, bool add, const F& f, const L&... in) {
    if constexpr (simd_floating<T>) {
        using batch = xsimd::batch<T>;
        constexpr std::size_t w = batch::size;
        std::size_t j = 0;
        for (const std::size_t end = n - n % w; j < end; j += w) {
            auto load = [j](const lane<T>& l) {
                return l.step ? batch::load_unaligned(l.p + j) : batch(*l.p);
            };
            batch r = f(load(in)...);
            if (add)
                r += batch::load_unaligned(out + j);
            r.store_unaligned(out + j);
        }
        if (j == n)
            return;
        const std::size_t rest = n - j;
        auto staged = [j, rest](const lane<T>& l) {
            alignas(batch::arch_type::alignment()) std::array<T, w> v{};
            for (std::size_t k = 0; k < rest; ++k)
                v[k] = l.p[(j + k) * l.step];
            return batch::load_aligned(v.data());
        };
        alignas(batch::arch_type::alignment()) std::array<T, w> r{};
        f(staged(in)...).store_aligned(r.data());
        for (std::size_t k = 0; k < rest; ++k)
            out[j + k] = add ? out[j + k] + r[k] : r[k];
    } else {
        for (std::size_t j = 0; j < n; ++j) {
            const T r = f(in.p[j * in.step]...);
            out[j] = add ? out[j] + r : r;
        }
    }
}

/// The sum of f(in[j]...) over j < n, `f` as map_run takes it: in batches of T for float and
/// double (then a scalar tail, f of T), else in scalars.
template <class T, class F, class... L>
T run_sum(std::size_t n, const F& f, const L&... in) {
    std::size_t j = 0;
    T sum = T(0);
    if constexpr (simd_floating<T>) {
        using batch = xsimd::batch<T>;
        constexpr std::size_t w = batch::size;
        auto at = [&f, &in...](std::size_t k) {
            auto load = [k](const lane<T>& l) {
                return l.step ? batch::load_unaligned(l.p + k) : batch(*l.p);
            };
            return f(load(in)...);
        };
        // Four accumulators, so that the additions do not wait on each other.
        batch acc[4] = {batch(T(0)), batch(T(0)), batch(T(0)), batch(T(0))};
        for (const std::size_t end = n - n % (4 * w); j < end; j += 4 * w)
            for (std::size_t u = 0; u < 4; ++u)
                acc[u] += at(j + u * w);
        for (const std::size_t end = n - n % w; j < end; j += w)
            acc[0] += at(j);
        sum = xsimd::hadd((acc[0] + acc[1]) + (acc[2] + acc[3]));
    }
    for (; j < n; ++j)
        sum += f(in.p[j * in.step]...);
    return sum;
}

/// The largest of p[0..n) (-infinity when n is 0), in batches of T for float and double.
template <class T>
T run_max(const T* p, std::size_t n) {
    std::size_t j = 0;
    T m = -std::numeric_limits<T>::infinity();
    if constexpr (simd_floating<T>) {
        using batch = xsimd::batch<T>;
        constexpr std::size_t w = batch::size;
        if (n >= w) {
            batch acc = batch::load_unaligned(p);
            for (j = w; j + w <= n; j += w)
                acc = xsimd::max(acc, batch::load_unaligned(p + j));
            alignas(batch::arch_type::alignment()) std::array<T, w> v{};
            acc.store_aligned(v.data());
            for (const T x : v)
                m = x > m ? x : m;
        }
    }
    for (; j < n; ++j)
        m = p[j] > m ? p[j] : m;
    return m;
}

/// out = f(a, b) elementwise with broadcasting (`f` as map_run takes it).
template <class T, class F>
void binary_forward(const forward_args& x, F f) {
    const auto& s = x.shards;
    const T* a = static_cast<const T*>(x.operands[0]);
    const T* b = static_cast<const T*>(x.operands[1]);
    T* y = static_cast<T*>(x.results[0]);
    const broadcast_walk<2> w(s.results[0].local, {&s.operands[0].local, &s.operands[1].local});
    const std::size_t sa = w.step(0), sb = w.step(1);
    w.run([&](std::size_t o, const auto& at, std::size_t n) {
        map_run<T>(y + o, n, false, f, lane<T>{a + at[0], sa}, lane<T>{b + at[1], sb});
    });
}

/// Operand `i`'s cotangent: g(dy, a, b) summed over the dimensions operand i broadcasts,
/// written or added (`accumulate`). Operands the VJP did not save are never read (`g` does
/// not use them).
template <class T, class G>
void binary_vjp_operand(const vjp_args& x, std::size_t i, G g) {
    T* d = static_cast<T*>(x.operand_cotangents[i]);
    if (!d)
        return;
    const auto& s = x.shards;
    const T* dy = static_cast<const T*>(x.result_cotangents[0]);
    const T* a = static_cast<const T*>(x.operands[0]);
    const T* b = static_cast<const T*>(x.operands[1]);
    // An operand that broadcasts nothing takes each of its elements once: written directly.
    const bool whole = s.operands[i].count() == s.results[0].count();
    const bool add = x.accumulate[i] || !whole;
    if (!x.accumulate[i] && (!whole || !dy))
        std::fill_n(d, s.operands[i].count(), T(0));
    if (!dy)
        return;
    const broadcast_walk<2> w(s.results[0].local, {&s.operands[0].local, &s.operands[1].local});
    const std::size_t sa = w.step(0), sb = w.step(1), sd = w.step(i);
    w.run([&](std::size_t o, const auto& at, std::size_t n) {
        const lane<T> la{a ? a + at[0] : dy + o, a ? sa : 1},
            lb{b ? b + at[1] : dy + o, b ? sb : 1}, ldy{dy + o, 1};
        if (sd == 1) {
            map_run<T>(d + at[i], n, add, g, ldy, la, lb);
            return;
        }
        T sum = T(0); // operand i broadcasts along the run (or is a scalar): one element
        for (std::size_t j = 0; j < n; ++j)
            sum += g(dy[o + j], la.p[j * la.step], lb.p[j * lb.step]);
        d[at[i]] = add ? d[at[i]] + sum : sum;
    });
}

template <class T, class GA, class GB>
void binary_vjp(const vjp_args& x, GA ga, GB gb) {
    binary_vjp_operand<T>(x, 0, ga);
    binary_vjp_operand<T>(x, 1, gb);
}

/// y = f(x) elementwise (`f` as map_run takes it).
template <class T, class F>
void unary_forward(const forward_args& x, F f) {
    map_run<T>(static_cast<T*>(x.results[0]), x.shards.results[0].count(), false, f,
               lane<T>{static_cast<const T*>(x.operands[0]), 1});
}

/// dx = g(dy, x, y) elementwise, written or added. What the VJP did not save is never read
/// (`g` does not use it).
template <class T, class G>
void unary_vjp(const vjp_args& v, G g) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    const std::size_t n = v.shards.operands[0].count();
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    const T* x = static_cast<const T*>(v.operands[0]);
    const T* y = static_cast<const T*>(v.results[0]);
    if (!dy) {
        if (!v.accumulate[0])
            std::fill_n(dx, n, T(0));
        return;
    }
    map_run<T>(dx, n, v.accumulate[0], g, lane<T>{dy, 1}, lane<T>{x ? x : dy, 1},
               lane<T>{y ? y : dy, 1});
}

/// The rules of a binary elementwise primitive.
constexpr op_rules binary_rules(std::string_view name, std::uint32_t saves) {
    return {.name = name,
            .infer = infer_elementwise,
            .rule = broadcast_rule,
            .batched = broadcast_batched,
            .resolve = resolve_each,
            .flops = elementwise_flops,
            .saves = saves};
}

XSHARD_DECL std::vector<result_spec> infer_unary(const op_attributes&,
                                                 std::span<const operand_type> ops);

inline layout_choice same_layout_rule(const op_attributes&, std::span<const operand_type>,
                                      std::vector<layout> asked, const mesh_shape&) {
    const layout l = whole_terms(asked[0]);
    return {{l}, {l}};
}

inline bool first_batched(const op_attributes&, std::span<const operand_type> ops,
                          std::size_t i) {
    return i == 0 && !ops[0].is_weight && !ops[0].shape.empty();
}

/// The rules of a unary elementwise primitive.
constexpr op_rules unary_rules(std::string_view name, std::uint32_t saves,
                               double transcendentals = 0, double backward_transcendentals = 0) {
    return {.name = name,
            .infer = infer_unary,
            .rule = same_layout_rule,
            .batched = first_batched,
            .resolve = resolve_each,
            .flops = elementwise_flops,
            .transcendentals = transcendentals,
            .backward_transcendentals = backward_transcendentals,
            .saves = saves};
}

inline constexpr op_rules add_rules = binary_rules("add", 0);
inline constexpr op_rules sub_rules = binary_rules("sub", 0);
inline constexpr op_rules mul_rules = binary_rules("mul", saves_operand(0) | saves_operand(1));
inline constexpr op_rules div_rules = binary_rules("div", saves_operand(0) | saves_operand(1));
inline constexpr op_rules maximum_rules =
    binary_rules("maximum", saves_operand(0) | saves_operand(1));
inline constexpr op_rules minimum_rules =
    binary_rules("minimum", saves_operand(0) | saves_operand(1));

inline constexpr op_rules neg_rules = unary_rules("neg", 0);
inline constexpr op_rules relu_rules = unary_rules("relu", saves_result(0));
// gelu: erf forward, erf and exp backward; the others one function forward, none backward.
inline constexpr op_rules gelu_rules = unary_rules("gelu", saves_operand(0), 1, 2);
inline constexpr op_rules exp_rules = unary_rules("exp", saves_result(0), 1);
inline constexpr op_rules log_rules = unary_rules("log", saves_operand(0), 1);
inline constexpr op_rules tanh_rules = unary_rules("tanh", saves_result(0), 1);
inline constexpr op_rules sigmoid_rules = unary_rules("sigmoid", saves_result(0), 1);
inline constexpr op_rules abs_rules = unary_rules("abs", saves_operand(0));
inline constexpr op_rules sqrt_rules = unary_rules("sqrt", saves_result(0));
inline constexpr op_rules square_rules = unary_rules("square", saves_operand(0));
inline constexpr op_rules scale_rules = unary_rules("scale", 0);
inline constexpr op_rules add_scalar_rules = unary_rules("add_scalar", 0);

template <class T>
T scalar_attribute(const node_shards& s) {
    return T(s.node->attributes.reals.at(0));
}

/// `value` in the type of `x`: a T, or a batch of T with every lane `value`.
template <class T, class V>
V like(const V&, double value) {
    return V(T(value));
}

/// The cotangent passed through unchanged (the VJP of add, and of sub's first operand).
inline constexpr auto pass_cotangent = [](auto g, auto, auto) {
    return g;
};

// The kernels below are generic lambdas of T or xsimd::batch<T> (map_run's `f`): `like` makes
// their constants and `choose` their branch-free conditionals.

template <class T>
void register_binary(auto&& add) {
    using A = const forward_args&;
    using V = const vjp_args&;
    add(primitive<T>{&add_rules,
                     [](A x) { binary_forward<T>(x, [](auto a, auto b) { return a + b; }); },
                     [](V v) {
                         binary_vjp<T>(v, pass_cotangent, pass_cotangent);
                     }});
    add(primitive<T>{&sub_rules,
                     [](A x) { binary_forward<T>(x, [](auto a, auto b) { return a - b; }); },
                     [](V v) {
                         binary_vjp<T>(v, pass_cotangent, [](auto g, auto, auto) { return -g; });
                     }});
    add(primitive<T>{&mul_rules,
                     [](A x) { binary_forward<T>(x, [](auto a, auto b) { return a * b; }); },
                     [](V v) {
                         binary_vjp<T>(
                             v, [](auto g, auto, auto b) { return g * b; },
                             [](auto g, auto a, auto) { return g * a; });
                     }});
    add(primitive<T>{&div_rules,
                     [](A x) { binary_forward<T>(x, [](auto a, auto b) { return a / b; }); },
                     [](V v) {
                         binary_vjp<T>(
                             v, [](auto g, auto, auto b) { return g / b; },
                             [](auto g, auto a, auto b) { return -g * a / (b * b); });
                     }});
    add(primitive<T>{
        &maximum_rules,
        [](A x) { binary_forward<T>(x, [](auto a, auto b) { return choose(a >= b, a, b); }); },
        [](V v) {
            binary_vjp<T>(
                v, [](auto g, auto a, auto b) { return choose(a >= b, g, like<T>(g, 0)); },
                [](auto g, auto a, auto b) { return choose(a >= b, like<T>(g, 0), g); });
        }});
    add(primitive<T>{
        &minimum_rules,
        [](A x) { binary_forward<T>(x, [](auto a, auto b) { return choose(a <= b, a, b); }); },
        [](V v) {
            binary_vjp<T>(
                v, [](auto g, auto a, auto b) { return choose(a <= b, g, like<T>(g, 0)); },
                [](auto g, auto a, auto b) { return choose(a <= b, like<T>(g, 0), g); });
        }});
}

template <class T>
void register_unary(auto&& add) {
    using A = const forward_args&;
    using V = const vjp_args&;
    add(primitive<T>{&neg_rules, [](A x) { unary_forward<T>(x, [](auto a) { return -a; }); },
                     [](V v) {
                         unary_vjp<T>(v, [](auto g, auto, auto) { return -g; });
                     }});
    add(primitive<T>{&relu_rules,
                     [](A x) {
                         unary_forward<T>(
                             x, [](auto a) { return choose(a > like<T>(a, 0), a, like<T>(a, 0)); });
                     },
                     [](V v) {
                         unary_vjp<T>(v, [](auto g, auto, auto y) {
                             return choose(y > like<T>(y, 0), g, like<T>(g, 0));
                         });
                     }});
    add(primitive<T>{
        &gelu_rules,
        [](A x) {
            unary_forward<T>(x, [](auto a) {
                return like<T>(a, 0.5) * a *
                       (like<T>(a, 1) + xsimd::erf(a * like<T>(a, std::numbers::sqrt2 / 2)));
            });
        },
        [](V v) {
            unary_vjp<T>(v, [](auto g, auto a, auto) {
                const auto cdf =
                    like<T>(a, 0.5) *
                    (like<T>(a, 1) + xsimd::erf(a * like<T>(a, std::numbers::sqrt2 / 2)));
                const auto pdf = xsimd::exp(like<T>(a, -0.5) * a * a) *
                                 like<T>(a, std::numbers::inv_sqrtpi / std::numbers::sqrt2);
                return g * (cdf + a * pdf);
            });
        }});
    add(primitive<T>{&exp_rules,
                     [](A x) { unary_forward<T>(x, [](auto a) { return xsimd::exp(a); }); },
                     [](V v) {
                         unary_vjp<T>(v, [](auto g, auto, auto y) { return g * y; });
                     }});
    add(primitive<T>{&log_rules,
                     [](A x) { unary_forward<T>(x, [](auto a) { return xsimd::log(a); }); },
                     [](V v) {
                         unary_vjp<T>(v, [](auto g, auto a, auto) { return g / a; });
                     }});
    add(primitive<T>{
        &tanh_rules, [](A x) { unary_forward<T>(x, [](auto a) { return xsimd::tanh(a); }); },
        [](V v) {
            unary_vjp<T>(v, [](auto g, auto, auto y) { return g * (like<T>(y, 1) - y * y); });
        }});
    add(primitive<T>{&sigmoid_rules,
                     [](A x) {
                         unary_forward<T>(x, [](auto a) {
                             return like<T>(a, 1) / (like<T>(a, 1) + xsimd::exp(-a));
                         });
                     },
                     [](V v) {
                         unary_vjp<T>(
                             v, [](auto g, auto, auto y) { return g * y * (like<T>(y, 1) - y); });
                     }});
    add(primitive<T>{
        &abs_rules, [](A x) { unary_forward<T>(x, [](auto a) { return xsimd::abs(a); }); },
        [](V v) {
            unary_vjp<T>(v, [](auto g, auto a, auto) {
                return choose(a > like<T>(a, 0), g, choose(a < like<T>(a, 0), -g, like<T>(g, 0)));
            });
        }});
    add(primitive<T>{
        &sqrt_rules, [](A x) { unary_forward<T>(x, [](auto a) { return xsimd::sqrt(a); }); },
        [](V v) {
            unary_vjp<T>(v, [](auto g, auto, auto y) { return g / (like<T>(y, 2) * y); });
        }});
    add(primitive<T>{&square_rules, [](A x) { unary_forward<T>(x, [](auto a) { return a * a; }); },
                     [](V v) {
                         unary_vjp<T>(v,
                                      [](auto g, auto a, auto) { return like<T>(a, 2) * a * g; });
                     }});
    add(primitive<T>{&scale_rules,
                     [](A x) {
                         const T k = scalar_attribute<T>(x.shards);
                         unary_forward<T>(x, [k](auto a) { return decltype(a)(k) * a; });
                     },
                     [](V v) {
                         const T k = scalar_attribute<T>(v.shards);
                         unary_vjp<T>(v, [k](auto g, auto, auto) { return decltype(g)(k) * g; });
                     }});
    add(primitive<T>{&add_scalar_rules,
                     [](A x) {
                         const T k = scalar_attribute<T>(x.shards);
                         unary_forward<T>(x, [k](auto a) { return a + decltype(a)(k); });
                     },
                     [](V v) {
                         unary_vjp<T>(v, [](auto g, auto, auto) { return g; });
                     }});
}

template <class T>
void register_elementwise(auto&& add) {
    register_binary<T>(add);
    register_unary<T>(add);
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitives/elementwise.ipp>
#endif
