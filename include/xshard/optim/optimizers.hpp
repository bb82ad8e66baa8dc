#pragma once
/// \file
/// Optimizers over the `weight`s of any parameter container: `sgd`, `momentum` (MindSpore's
/// Momentum), `adam` and `adamw` (PyTorch's Adam and AdamW). Each is `optimizer<Rule>`, the
/// step count, checks and state slots around an update rule (`sgd_rule`, ...); a rule of
/// one's own (concept `update_rule`) makes a new optimizer.
///
///     xshard::optim::adam opt({.lr = 1e-3});
///     ...                                   // forward, backward, synchronize_gradients
///     opt.step(model);                      // or opt.step(model, schedule(opt.steps()))
///
/// `step` needs complete gradients (synchronised: see xshard/train/gradients.hpp). A weight's
/// value, gradient and state slots share one layout, so an update is elementwise on this rank's
/// blocks (vectorised xtensor expressions): a step communicates nothing, and the redundant
/// copies of a replicated weight take identical steps. The state slots (momentum, Adam's
/// moments) live in `weight::state`, laid out like the value; a weight without them gets zeros
/// at its first step (or at `state_of`). Under optimizer sharding (xshard/train/hsdp.hpp) a
/// weight's `shard` is updated instead: this rank's block of the master copy, the gradient and
/// the slots, all in the sharded layout; the sharding object gathers the weights afterwards.
/// Every check looks only at what all ranks share
/// (options, names, layouts, global shapes), so misuse throws `xshard::error` on every rank.
///
/// Element types: float and double weights are updated in their own type; float16 and
/// bfloat16 ones are computed in float and stored, value and slots alike, in 16 bits (so
/// Adam's second moment underflows for gradients below about 2e-4 in float16: keep float
/// master weights for mixed precision).
///
/// Checkpoints: `state_of(model)` is a parameter container of the slots, named
/// "<slot>.<weight name>" ("adam_m.dense1.weight"). Save it with the model, with the step count
/// (Adam's bias correction depends on it), and restore both:
///
///     xshard::save_checkpoint(path, model, {.step = opt.steps()}, opt.state_of(model));
///     const auto info = xshard::load_checkpoint(path, model, opt.state_of(model));
///     opt.set_steps(info.step);

#include <xshard/compiled.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/float16.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/traversal.hpp>

#include <xsimd/xsimd.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xtensor.hpp>

#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

namespace optim {

/// The element types of the weights an optimizer updates.
template <class T>
concept trainable_element =
    std::same_as<T, float> || std::same_as<T, double> || sixteen_bit_float<T>;

/// Runs `rule(p, g, slot)` on weight `w`'s blocks in the compute type, for update rules: `p`
/// its value, `g` its gradient, `slot(k)` its state slot k (all `xt::xtensor<C, N>&`, C float
/// or double). Blocks of 16-bit weights go through float copies, rounded back to 16 bits
/// afterwards. Local: no communication.
template <class W, class Rule>
void update_locally(W& w, Rule&& rule) {
    using D = typename W::tensor_type;
    using T = typename D::value_type;
    if constexpr (sixteen_bit_float<T>) {
        using F = xt::xtensor<float, D::rank>;
        F p = xt::cast<float>(w.value.local());
        const F g = xt::cast<float>(w.grad.local());
        std::vector<F> s;
        for (const auto& t : w.state)
            s.push_back(xt::cast<float>(t.local()));
        rule(p, g, [&](std::size_t k) -> F& { return s[k]; });
        xt::noalias(w.value.local()) = xt::cast<T>(p);
        for (std::size_t k = 0; k < s.size(); ++k)
            xt::noalias(w.state[k].local()) = xt::cast<T>(s[k]);
    } else {
        rule(w.value.local(), std::as_const(w.grad.local()),
             [&](std::size_t k) -> typename D::local_type& { return w.state[k].local(); });
    }
}

} // namespace optim

namespace detail {

/// Momentum's update of n contiguous elements in one pass: v = mu v + g, then w -= lr v (or
/// with Nesterov w -= lr (g + mu v)), vectorised (xsimd).
template <class C>
void momentum_pass(C* w, C* v, const C* g, std::size_t n, C mu, C lr, bool nesterov) {
    using batch = xsimd::batch<C>;
    const batch bmu(mu), blr(lr);
    std::size_t j = 0;
    for (const std::size_t vec_end = n - n % batch::size; j < vec_end; j += batch::size) {
        const batch bg = batch::load_unaligned(g + j);
        const batch bv = bmu * batch::load_unaligned(v + j) + bg;
        bv.store_unaligned(v + j);
        const batch step = nesterov ? bg + bmu * bv : bv;
        (batch::load_unaligned(w + j) - blr * step).store_unaligned(w + j);
    }
    for (; j < n; ++j) {
        v[j] = mu * v[j] + g[j];
        w[j] -= lr * (nesterov ? g[j] + mu * v[j] : v[j]);
    }
}

/// Calls `f(g)`, or `f(g + decay * p)` with an L2 penalty (none then costs nothing).
template <class G, class P, class C, class F>
void with_l2(const G& g, const P& p, C decay, F&& f) {
    if (decay == C(0))
        f(g);
    else
        f(g + decay * p);
}

XSHARD_DECL std::string optim_number(double x);

/// Throws unless option `option` of optimizer `who` is finite and not negative.
XSHARD_DECL void require_nonnegative(std::string_view who, std::string_view option, double value);

/// Throws unless option `option` of optimizer `who` lies in [0, 1).
XSHARD_DECL void require_unit(std::string_view who, std::string_view option, double value);

/// Checks the options Adam and AdamW share.
template <class Options>
void require_adam_options(std::string_view who, const Options& o) {
    require_nonnegative(who, "lr", o.lr);
    require_unit(who, "beta1", o.beta1);
    require_unit(who, "beta2", o.beta2);
    require_nonnegative(who, "eps", o.eps);
    require_nonnegative(who, "weight_decay", o.weight_decay);
}

/// "[-, mp] (7, 5)".
template <class D>
std::string optim_describe(const D& t) {
    return t.layout().to_string() + " " + shape_string(t.shape());
}

/// Throws unless `t` (the `what` of weight `name`) has the layout and shape of the value.
template <class D, class V>
void require_like_value(std::string_view who, const std::string& name, const std::string& what,
                        const D& t, const V& value) {
    if (!(t.layout() == value.layout()) || t.shape() != value.shape())
        throw error("xshard: " + std::string(who) + ": the " + what + " of weight '" + name +
                    "' is " + optim_describe(t) + " but its value is " + optim_describe(value) +
                    "; they must have the same layout and shape");
}

/// Throws if weight `name`'s gradient is partial: each rank's term of a sum still pending.
template <class W>
void require_complete_gradient(std::string_view who, const std::string& name, const W& w) {
    if (w.grad.layout().is_partial())
        throw error("xshard: " + std::string(who) + ": the gradient of weight '" + name +
                    "' is partial " + optim_describe(w.grad) +
                    "; sum it over the weight's replicas (synchronize_gradients) before a step");
}

/// Throws: weight `name` has `held` state slots, not those of `slots` that `who` keeps.
[[noreturn]] XSHARD_DECL void throw_slot_count(std::string_view who,
                                               std::span<const std::string_view> slots,
                                               const std::string& name, std::size_t held);

/// Gives weight `name` zero state slots, one per name in `slots`, if it has none; throws if
/// it has another number of them or one unlike its value.
template <class W>
void prepare_slots(std::string_view who, std::span<const std::string_view> slots,
                   const std::string& name, W& w) {
    using D = typename W::tensor_type;
    using T = typename D::value_type;
    static_assert(optim::trainable_element<T>,
                  "xshard: optimizers update weights of float, double, float16 or bfloat16");
    if (w.state.empty()) {
        for (std::size_t k = 0; k < slots.size(); ++k) {
            D s = w.value;
            s.local().fill(T(0));
            w.state.push_back(std::move(s));
        }
        return;
    }
    if (w.state.size() != slots.size())
        throw_slot_count(who, slots, name, w.state.size());
    for (std::size_t k = 0; k < slots.size(); ++k)
        require_like_value(who, name, "state slot '" + std::string(slots[k]) + "'", w.state[k],
                           w.value);
}

} // namespace detail

namespace optim {

/// Calls `f(u)` with what an optimizer updates of weight `w`: its `shard` (value, gradient and
/// state slots in the sharded layout) under optimizer sharding (train/hsdp.hpp), else `w`.
template <class W, class F>
void with_update_target(W& w, F&& f) {
    if (w.shard)
        f(*w.shard);
    else
        f(w);
}

/// The optimizer state of the weights of container `C` as a parameter container: weight
/// "dense1.weight"'s slot "adam_m" is the parameter "adam_m.dense1.weight" (slot by slot, each
/// in the container's order). Made by an optimizer's `state_of`; visiting it gives weights
/// without state their zero slots, so a checkpoint can be loaded into it before the first
/// step. It refers to the container, which must outlive it.
template <class C>
struct state_view {
    C& container;
    std::string_view optimizer;
    std::span<const std::string_view> slots;

    friend void visit_parameters(state_view& s, auto&& visit) {
        for (std::size_t k = 0; k < s.slots.size(); ++k)
            for_each_weight(s.container, [&](const std::string& name, auto& w) {
                with_update_target(w, [&](auto& u) {
                    xshard::detail::prepare_slots(s.optimizer, s.slots, name, u);
                    visit(std::string(s.slots[k]) + "." + name, u.state[k]);
                });
            });
    }
};

/// Drops the optimizer state of every weight of `model` (to change optimizers, or to start
/// afresh), sharded state included. No communication.
template <parameter_container M>
void clear_state(M& model) {
    for_each_weight(model, [](const std::string&, auto& w) {
        w.state.clear();
        if (w.shard)
            w.shard->state.clear();
    });
}

} // namespace optim

namespace optim {

/// What an optimizer's update rule provides to `optimizer<Rule>`: its options (checked by
/// its constructor, which throws xshard::error if one is out of range), its `name` (for
/// messages) and the names of its per-weight state slots (`slots`, a std::array of
/// string_view; checkpoints name them), plus a member template `update(w, lr, t)` that
/// updates one `weight` locally at step t (1-based) with learning rate lr, reading slot k as
/// `w.state[k]` (`update_locally` gives it in the compute type).
template <class R>
concept update_rule = std::constructible_from<R, const typename R::options_type&> &&
    requires(const R& r) {
    { R::name } -> std::convertible_to<std::string_view>;
    {std::span<const std::string_view>(R::slots)};
    { r.options() } -> std::same_as<const typename R::options_type&>;
};

/// An optimizer: the step count, the checks and allocation of the weights' state slots, and
/// `state_of`, around an update rule (`sgd_rule`, `momentum_rule`, `adam_rule`,
/// `adamw_rule`, or a user's own). `sgd`, `momentum`, `adam` and `adamw` are its
/// instances. A step communicates nothing (see the file comment).
template <update_rule Rule>
class optimizer {
public:
    using rule_type = Rule;
    using options_type = typename Rule::options_type;
    static constexpr std::string_view name = Rule::name;
    /// The names of the per-weight state slots.
    static constexpr auto slots = Rule::slots;

    /// Throws xshard::error if an option is out of range.
    explicit optimizer(const options_type& options = {})
        : rule_(options) {}

    /// The options the optimizer was made with.
    const options_type& options() const noexcept { return rule_.options(); }

    /// The number of steps taken (0 before the first; the index a schedule takes).
    std::int64_t steps() const noexcept { return steps_; }

    /// Sets the step count: after loading a checkpoint, to the step saved with it.
    void set_steps(std::int64_t steps) {
        if (steps < 0)
            throw error("xshard: " + std::string(name) + ": the step count must be >= 0, not " +
                        std::to_string(steps));
        steps_ = steps;
    }

    /// Updates every weight of `model` from its gradient at the options' learning rate and
    /// counts a step. Local (no communication). Throws before updating any weight if one has
    /// another optimizer's state, or a gradient or slot unlike its value.
    template <parameter_container M>
    void step(M& model) {
        step(model, options().lr);
    }

    /// `step(model)` at learning rate `lr` for this step (a schedule's, say).
    template <parameter_container M>
    void step(M& model, double lr) {
        static_assert(!std::is_const_v<M>, "xshard: an optimizer updates its model: pass it "
                                           "non-const");
        detail::require_nonnegative(name, "lr", lr);
        prepare(model, true);
        ++steps_;
        for_each_weight(model, [&](const std::string&, auto& w) {
            with_update_target(w, [&](auto& u) { rule_.update(u, lr, steps_); });
        });
    }

    /// The optimizer's state of `model`'s weights, as a parameter container named
    /// "<slot>.<weight name>" (see `state_view`), for save_checkpoint and load_checkpoint.
    /// Gives weights without state their zero slots now; throws if one has another
    /// optimizer's. No communication.
    template <parameter_container M>
    state_view<M> state_of(M& model) const {
        static_assert(!std::is_const_v<M>, "xshard: state_of may allocate state slots: pass the "
                                           "model non-const");
        prepare(model, false);
        return {model, name, Rule::slots};
    }

private:
    /// Gives weights without state their zero slots, and throws if one has another
    /// optimizer's; with `gradients`, also if a gradient is incomplete or unlike its value.
    /// (One walk serves step and state_of, so that a program compiles it once.)
    template <class M>
    void prepare(M& model, bool gradients) const {
        for_each_weight(model, [&](const std::string& weight_name, auto& w) {
            with_update_target(w, [&](auto& u) {
                detail::prepare_slots(name, Rule::slots, weight_name, u);
                if (gradients) {
                    detail::require_complete_gradient(name, weight_name, u);
                    detail::require_like_value(name, weight_name, "gradient", u.grad, u.value);
                }
            });
        });
    }

    Rule rule_;
    std::int64_t steps_ = 0;
};

} // namespace optim

namespace detail {

/// Adam's moments and parameter update at step t (PyTorch's Adam, after any weight decay) on
/// blocks `p`, `g`, slot(0) = m, slot(1) = v: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g²,
/// p -= lr / (1 - b1^t) · m / (√v / √(1 - b2^t) + eps).
template <class P, class G, class S>
void adam_update(P& p, const G& g, S&& slot, double lr, std::int64_t t, double beta1, double beta2,
                 double eps) {
    using C = typename P::value_type;
    auto& m = slot(0);
    auto& v = slot(1);
    xt::noalias(m) = C(beta1) * m + C(1 - beta1) * g;
    xt::noalias(v) = C(beta2) * v + C(1 - beta2) * g * g;
    const C step_size = C(lr / (1 - std::pow(beta1, double(t))));
    const C correction2 = C(std::sqrt(1 - std::pow(beta2, double(t))));
    xt::noalias(p) = p - step_size * m / (xt::sqrt(v) / correction2 + C(eps));
}

} // namespace detail

namespace optim {

/// Options of `sgd`.
struct sgd_options {
    /// The learning rate.
    double lr = 1e-3;
    /// L2 penalty: weight_decay · w is added to the gradient.
    double weight_decay = 0;
};

/// The update rule of `sgd`, stochastic gradient descent: w -= lr · (g + weight_decay · w). No
/// state.
class sgd_rule {
public:
    using options_type = sgd_options;
    static constexpr std::string_view name = "sgd";
    static constexpr std::array<std::string_view, 0> slots{};

    /// Throws xshard::error if an option is out of range.
    explicit sgd_rule(const sgd_options& options)
        : options_(options) {
        detail::require_nonnegative(name, "lr", options.lr);
        detail::require_nonnegative(name, "weight_decay", options.weight_decay);
    }

    const sgd_options& options() const noexcept { return options_; }

    /// Updates weight `w` locally at step t with learning rate lr.
    template <class W>
    void update(W& w, double lr, std::int64_t) const {
        update_locally(w, [&](auto& p, const auto& grad, auto&&) {
            using C = typename std::remove_cvref_t<decltype(p)>::value_type;
            detail::with_l2(grad, p, C(options_.weight_decay),
                            [&](const auto& g) { xt::noalias(p) = p - C(lr) * g; });
        });
    }

private:
    sgd_options options_;
};

/// Stochastic gradient descent (`sgd_rule`).
using sgd = optimizer<sgd_rule>;

/// Options of `momentum`.
struct momentum_options {
    /// The learning rate.
    double lr = 1e-3;
    /// The decay of the accumulated velocity.
    double momentum = 0.9;
    /// Nesterov's look-ahead form.
    bool nesterov = false;
    /// L2 penalty: weight_decay · w is added to the gradient.
    double weight_decay = 0;
};

/// The update rule of `momentum`, SGD with momentum (MindSpore's Momentum): with g' = g +
/// weight_decay · w, v = momentum · v + g', then w -= lr · v, or with Nesterov w -= lr · (g' +
/// momentum · v). One state slot, "momentum" (v).
class momentum_rule {
public:
    using options_type = momentum_options;
    static constexpr std::string_view name = "momentum";
    static constexpr std::array<std::string_view, 1> slots{"momentum"};

    /// Throws xshard::error if an option is out of range.
    explicit momentum_rule(const momentum_options& options)
        : options_(options) {
        detail::require_nonnegative(name, "lr", options.lr);
        detail::require_nonnegative(name, "momentum", options.momentum);
        detail::require_nonnegative(name, "weight_decay", options.weight_decay);
    }

    const momentum_options& options() const noexcept { return options_; }

    /// Updates weight `w` locally at step t with learning rate lr.
    template <class W>
    void update(W& w, double lr, std::int64_t) const {
        update_locally(w, [&](auto& p, const auto& grad, auto&& slot) {
            using C = typename std::remove_cvref_t<decltype(p)>::value_type;
            auto& v = slot(0);
            const C mu = C(options_.momentum);
            detail::with_l2(grad, p, C(options_.weight_decay), [&](const auto& g) {
                if constexpr (requires { g.data(); } && detail::simd_floating<C>) {
                    // Contiguous gradients (no L2 term): one vectorised pass reading g, v and
                    // w and writing v and w, where the two expressions below make two (ResNet-18's
                    // 11 M float updates: 6 ms against 8 ms on the development machine).
                    detail::momentum_pass(p.data(), v.data(), g.data(), p.size(), mu, C(lr),
                                          options_.nesterov);
                } else {
                    xt::noalias(v) = mu * v + g;
                    if (options_.nesterov)
                        xt::noalias(p) = p - C(lr) * (g + mu * v);
                    else
                        xt::noalias(p) = p - C(lr) * v;
                }
            });
        });
    }

private:
    momentum_options options_;
};

/// SGD with momentum, MindSpore's Momentum (`momentum_rule`).
using momentum = optimizer<momentum_rule>;

/// Options of `adam`.
struct adam_options {
    /// The learning rate.
    double lr = 1e-3;
    /// The decay of the first moment (mean of the gradients).
    double beta1 = 0.9;
    /// The decay of the second moment (mean of their squares).
    double beta2 = 0.999;
    /// Added to the root of the second moment (numerical stability).
    double eps = 1e-8;
    /// L2 penalty: weight_decay · w is added to the gradient.
    double weight_decay = 0;
};

/// The update rule of `adam`, Adam with bias correction (PyTorch's): see detail::adam_update, with
/// g + weight_decay · w for the gradient. Two state slots, "adam_m" and "adam_v" (the moments).
class adam_rule {
public:
    using options_type = adam_options;
    static constexpr std::string_view name = "adam";
    static constexpr std::array<std::string_view, 2> slots{"adam_m", "adam_v"};

    /// Throws xshard::error if an option is out of range.
    explicit adam_rule(const adam_options& options)
        : options_(options) {
        detail::require_adam_options(name, options);
    }

    const adam_options& options() const noexcept { return options_; }

    /// Updates weight `w` locally at step t with learning rate lr.
    template <class W>
    void update(W& w, double lr, std::int64_t t) const {
        const auto& o = options_;
        update_locally(w, [&](auto& p, const auto& grad, auto&& slot) {
            using C = typename std::remove_cvref_t<decltype(p)>::value_type;
            detail::with_l2(grad, p, C(o.weight_decay), [&](const auto& g) {
                detail::adam_update(p, g, slot, lr, t, o.beta1, o.beta2, o.eps);
            });
        });
    }

private:
    adam_options options_;
};

/// Adam, PyTorch's (`adam_rule`).
using adam = optimizer<adam_rule>;

/// Options of `adamw`.
struct adamw_options {
    /// The learning rate.
    double lr = 1e-3;
    /// The decay of the first moment (mean of the gradients).
    double beta1 = 0.9;
    /// The decay of the second moment (mean of their squares).
    double beta2 = 0.999;
    /// Added to the root of the second moment (numerical stability).
    double eps = 1e-8;
    /// Decoupled weight decay: w -= lr · weight_decay · w before each update.
    double weight_decay = 1e-2;
};

/// The update rule of `adamw`, Adam with decoupled weight decay (PyTorch's AdamW): w -= lr ·
/// weight_decay · w, then Adam's update without L2 penalty. Two state slots, "adam_m" and "adam_v".
class adamw_rule {
public:
    using options_type = adamw_options;
    static constexpr std::string_view name = "adamw";
    static constexpr std::array<std::string_view, 2> slots{"adam_m", "adam_v"};

    /// Throws xshard::error if an option is out of range.
    explicit adamw_rule(const adamw_options& options)
        : options_(options) {
        detail::require_adam_options(name, options);
    }

    const adamw_options& options() const noexcept { return options_; }

    /// Updates weight `w` locally at step t with learning rate lr.
    template <class W>
    void update(W& w, double lr, std::int64_t t) const {
        const auto& o = options_;
        update_locally(w, [&](auto& p, const auto& g, auto&& slot) {
            using C = typename std::remove_cvref_t<decltype(p)>::value_type;
            if (o.weight_decay != 0)
                p *= C(1 - lr * o.weight_decay);
            detail::adam_update(p, g, slot, lr, t, o.beta1, o.beta2, o.eps);
        });
    }

private:
    adamw_options options_;
};

/// AdamW, PyTorch's (`adamw_rule`).
using adamw = optimizer<adamw_rule>;

} // namespace optim

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/optim/optimizers.ipp>
#endif
