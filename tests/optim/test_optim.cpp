// Optimizers and learning-rate schedules, against the same algorithms written serially on
// xtensor arrays: a model of weights of several layouts takes several steps on every mesh of
// the world, and every weight and state slot, gathered, must equal the serial run.

#include <xshard/io/checkpoint.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/optim/schedules.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>

#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace optim = xshard::optim;
using xshard::layout;
using xshard::testing::for_each_world_mesh;
using xshard::testing::shared_directory;
using xshard::testing::where;
using xshard::testing::world;
using M = xshard::mesh<"dp", "mp">;

// --- schedules, at compile time -----------------------------------------------------------

constexpr bool near(double a, double b) {
    const double d = a > b ? a - b : b - a;
    return d <= 1e-15 * (1 + (b < 0 ? -b : b));
}

constexpr optim::warmup_cosine cosine{
    .base_lr = 1.0, .warmup_steps = 4, .total_steps = 12, .min_lr = 0.1};

static_assert(optim::lr_schedule<optim::constant_lr> && optim::lr_schedule<optim::warmup_cosine>);
static_assert(optim::constant_lr{0.5}(0) == 0.5 && optim::constant_lr{0.5}(7) == 0.5);
// Warm-up from base_lr / 4 to base_lr.
static_assert(cosine(0) == 0.25 && cosine(1) == 0.5 && cosine(3) == 1.0);
// Cosine from base_lr (step 4) to min_lr (step 12): cos 0, π/4, π/2, 3π/4.
static_assert(near(cosine(4), 1.0));
static_assert(near(cosine(6), 0.1 + 0.9 * 0.5 * (1 + std::numbers::sqrt2 / 2)));
static_assert(near(cosine(8), 0.55));
static_assert(near(cosine(10), 0.1 + 0.9 * 0.5 * (1 - std::numbers::sqrt2 / 2)));
// min_lr from total_steps on.
static_assert(cosine(12) == 0.1 && cosine(1000) == 0.1);
// No warm-up: base_lr at step 0.
static_assert(optim::warmup_cosine{.base_lr = 2, .total_steps = 4}(0) == 2);
// No decay (total_steps == warmup_steps): min_lr right after the warm-up.
static_assert(optim::warmup_cosine{.base_lr = 2, .warmup_steps = 2, .total_steps = 2}(2) == 0);

// --- meshes and data --------------------------------------------------------------------

using shape_t = std::vector<std::size_t>;

/// A seed from a weight's name and a step, the same on every rank (FNV-1a).
unsigned seed_of(const std::string& name, int step) {
    unsigned h = 2166136261u;
    for (unsigned char c : name)
        h = (h ^ c) * 16777619u;
    return h + unsigned(step) * 7919u;
}

/// Weight `name`'s starting value: normal numbers.
xt::xarray<double> initial_value(const std::string& name, const shape_t& shape) {
    std::mt19937 engine(seed_of(name, 0));
    return xt::random::randn<double>(shape, 0.0, 1.0, engine);
}

/// Its gradient at step `step` (1-based): normal numbers, or with `away_from_zero` of
/// magnitude at least 0.5 (so that 16-bit second moments do not underflow).
xt::xarray<double> gradient(const std::string& name, const shape_t& shape, int step,
                            bool away_from_zero) {
    std::mt19937 engine(seed_of(name, step));
    xt::xarray<double> g = xt::random::randn<double>(shape, 0.0, 1.0, engine);
    if (away_from_zero)
        g += 0.5 * xt::sign(g);
    return g;
}

template <class D>
shape_t shape_of(const D& t) {
    return shape_t(t.shape().begin(), t.shape().end());
}

/// `global` (which every rank holds) distributed like `t`: same mesh, layout, element type.
template <class D>
D like(const D& t, const xt::xarray<double>& global) {
    using T = typename D::value_type;
    const xt::xtensor<T, D::rank> g = xt::cast<T>(global);
    return xshard::distribute<D::static_layout>(t.mesh(), g, t.layout());
}

/// The global array of `t` on every rank. (gather cannot take 16-bit elements: `t` goes
/// through a float copy then.)
template <class D>
auto gathered(const D& t) {
    using T = typename D::value_type;
    if constexpr (xshard::sixteen_bit_float<T>) {
        using F = xshard::dtensor<float, typename D::mesh_type, D::static_layout>;
        return xshard::gather_all(F(t.mesh(), t.shape(),
                                    xt::xtensor<float, D::rank>(xt::cast<float>(t.local())),
                                    t.layout()));
    } else {
        return xshard::gather_all(t);
    }
}

/// Weight `name` of shape `shape` laid out as `l`, with its starting value.
template <class D>
xshard::weight<D> make_weight(const M& m, const std::string& name, const shape_t& shape,
                              const layout& l) {
    using T = typename D::value_type;
    const xt::xtensor<T, D::rank> g = xt::cast<T>(initial_value(name, shape));
    return xshard::weight<D>(xshard::distribute<D::static_layout>(m, g, l));
}

// --- the model --------------------------------------------------------------------------

template <class W, class B>
struct dense {
    xshard::weight<W> weight;
    xshard::weight<B> bias;
    friend void visit_parameters(dense& d, auto&& visit) {
        visit("weight", d.weight);
        visit("bias", d.bias);
    }
};

/// Two dense layers and an embedding: weights of rank 2 and 1, replicated or split over
/// either mesh axis or both, of uneven sizes (dense2.bias, 3 split over 4 ranks, leaves one
/// rank an empty block).
template <class W1, class B1, class W2, class B2, class E>
struct net {
    dense<W1, B1> dense1;
    dense<W2, B2> dense2;
    xshard::weight<E> embedding;
    friend void visit_parameters(net& n, auto&& visit) {
        visit("dense1", n.dense1);
        visit("dense2", n.dense2);
        visit("embedding", n.embedding);
    }
};

const std::vector<std::string> weight_names{"dense1.weight", "dense1.bias", "dense2.weight",
                                            "dense2.bias", "embedding"};

/// A net on `m` with its starting values, its weights laid out as `l` (in visiting order).
template <class W1, class B1, class W2, class B2, class E>
net<W1, B1, W2, B2, E> make_net(const M& m, const std::array<layout, 5>& l) {
    return {{make_weight<W1>(m, "dense1.weight", {7, 5}, l[0]),
             make_weight<B1>(m, "dense1.bias", {5}, l[1])},
            {make_weight<W2>(m, "dense2.weight", {5, 3}, l[2]),
             make_weight<B2>(m, "dense2.bias", {3}, l[3])},
            make_weight<E>(m, "embedding", {9, 4}, l[4])};
}

/// The net with layouts in its type.
template <class T>
auto make_static_net(const M& m) {
    using xshard::dtensor;
    return make_net<dtensor<T, M, "[-, mp]">, dtensor<T, M, "[-]">, dtensor<T, M, "[dp, -]">,
                    dtensor<T, M, "[mp]">, dtensor<T, M, "[dp, mp]">>(
        m,
        {layout("[-, mp]"), layout("[-]"), layout("[dp, -]"), layout("[mp]"), layout("[dp, mp]")});
}

using dyn1 = xshard::dtensor<double, M, xshard::dynamic_layout(1)>;
using dyn2 = xshard::dtensor<double, M, xshard::dynamic_layout(2)>;

/// The net with run-time layouts.
auto make_dynamic_net(const M& m, const std::array<layout, 5>& l) {
    return make_net<dyn2, dyn1, dyn2, dyn1, dyn2>(m, l);
}

const std::array<layout, 5> layouts_a{layout("[dp, -]"), layout("[dp]"), layout("[-, -]"),
                                      layout("[-]"), layout("[mp, dp]")};
const std::array<layout, 5> layouts_b{layout("[mp, -]"), layout("[-]"), layout("[-, mp]"),
                                      layout("[mp]"), layout("[-, -]")};

// --- the serial reference ---------------------------------------------------------------

/// A weight of the serial reference: the global arrays.
struct serial_weight {
    std::string name;
    xt::xarray<double> value, grad;
    std::vector<xt::xarray<double>> state;
};

/// The serial copy of a container's weights (names, shapes, starting values).
template <class C>
std::vector<serial_weight> serial_of(C& c) {
    std::vector<serial_weight> s;
    xshard::for_each_weight(c, [&](const std::string& name, auto& w) {
        s.push_back({name, initial_value(name, shape_of(w.value)), {}, {}});
    });
    return s;
}

/// The optimizers' textbook formulas, one element at a time.
void serial_update(const optim::sgd_options& o, serial_weight& w, double lr, std::int64_t) {
    double* p = w.value.data();
    for (std::size_t i = 0; i < w.value.size(); ++i)
        p[i] -= lr * (w.grad.data()[i] + o.weight_decay * p[i]);
}

void serial_update(const optim::momentum_options& o, serial_weight& w, double lr, std::int64_t) {
    if (w.state.empty())
        w.state = {xt::zeros_like(w.value)};
    double* p = w.value.data();
    double* v = w.state[0].data();
    for (std::size_t i = 0; i < w.value.size(); ++i) {
        const double g = w.grad.data()[i] + o.weight_decay * p[i];
        v[i] = o.momentum * v[i] + g;
        p[i] -= o.nesterov ? lr * (g + o.momentum * v[i]) : lr * v[i];
    }
}

/// Adam with an L2 penalty `l2` or a decoupled decay `decoupled`: m̂ / (√v̂ + eps).
void serial_adam(serial_weight& w, double lr, std::int64_t t, double beta1, double beta2,
                 double eps, double l2, double decoupled) {
    if (w.state.empty())
        w.state = {xt::zeros_like(w.value), xt::zeros_like(w.value)};
    double* p = w.value.data();
    double* m = w.state[0].data();
    double* v = w.state[1].data();
    for (std::size_t i = 0; i < w.value.size(); ++i) {
        p[i] *= 1 - lr * decoupled;
        const double g = w.grad.data()[i] + l2 * p[i];
        m[i] = beta1 * m[i] + (1 - beta1) * g;
        v[i] = beta2 * v[i] + (1 - beta2) * g * g;
        const double m_hat = m[i] / (1 - std::pow(beta1, double(t)));
        const double v_hat = v[i] / (1 - std::pow(beta2, double(t)));
        p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
}

void serial_update(const optim::adam_options& o, serial_weight& w, double lr, std::int64_t t) {
    serial_adam(w, lr, t, o.beta1, o.beta2, o.eps, o.weight_decay, 0);
}

void serial_update(const optim::adamw_options& o, serial_weight& w, double lr, std::int64_t t) {
    serial_adam(w, lr, t, o.beta1, o.beta2, o.eps, 0, o.weight_decay);
}

// --- training -----------------------------------------------------------------------------

/// The rates of steps 3 on (steps 1 and 2 take the options' rate).
constexpr optim::warmup_cosine schedule{
    .base_lr = 0.05, .warmup_steps = 2, .total_steps = 6, .min_lr = 0.005};

/// `steps` more steps of `opt` on `c`, each with fresh gradients: the first two steps of a run
/// at the options' rate, the others at the schedule's.
template <class Opt, class C>
void train(Opt& opt, C& c, int steps, bool away_from_zero = false) {
    for (int k = 0; k < steps; ++k) {
        const int step = int(opt.steps()) + 1;
        xshard::for_each_weight(c, [&](const std::string& name, auto& w) {
            w.set_gradient(like(w.value, gradient(name, shape_of(w.value), step, away_from_zero)));
        });
        if (step <= 2)
            opt.step(c);
        else
            opt.step(c, schedule(opt.steps()));
    }
}

/// The same on the serial reference, steps 1 to `steps`.
template <class Options>
void train_serial(const Options& o, std::vector<serial_weight>& s, int steps,
                  bool away_from_zero = false) {
    for (int step = 1; step <= steps; ++step) {
        const double lr = step <= 2 ? o.lr : schedule(step - 1);
        for (auto& w : s) {
            w.grad = gradient(w.name, shape_t(w.value.shape().begin(), w.value.shape().end()), step,
                              away_from_zero);
            serial_update(o, w, lr, step);
        }
    }
}

/// Expects every weight of `c` and its state in `opt` (by state_of's names), gathered, to
/// equal the serial reference within `tol` (relative, absolute near zero). Collective.
template <class Opt, class C>
void expect_matches(const Opt& opt, C& c, const std::vector<serial_weight>& s, double tol,
                    const std::string& context) {
    std::map<std::string, const xt::xarray<double>*> expected;
    for (const auto& w : s) {
        expected[w.name] = &w.value;
        for (std::size_t k = 0; k < w.state.size(); ++k)
            expected[std::string(Opt::slots[k]) + "." + w.name] = &w.state[k];
    }
    std::size_t seen = 0;
    auto check = [&](const std::string& name, const auto& t) {
        const auto it = expected.find(name);
        ASSERT_NE(it, expected.end()) << "unexpected tensor " << name << " " << context;
        ++seen;
        const auto got = gathered(t);
        const auto& want = *it->second;
        ASSERT_EQ(got.size(), want.size()) << name << " " << context;
        for (std::size_t i = 0; i < want.size(); ++i) {
            const double a = double(got.data()[i]), b = want.data()[i];
            if (!(std::abs(a - b) <= tol * (1 + std::abs(b)))) {
                ADD_FAILURE() << name << " " << t.layout() << " element " << i << ": " << a
                              << ", the serial run has " << b << " " << context;
                return;
            }
        }
    };
    xshard::for_each_parameter(c, check);
    xshard::for_each_parameter(opt.state_of(c), check);
    EXPECT_EQ(seen, expected.size()) << context;
}

/// The options tested of each optimizer: the defaults but the rate, and every option set.
template <class Opt>
std::vector<typename Opt::options_type> configurations() {
    if constexpr (std::is_same_v<Opt, optim::sgd>)
        return {{.lr = 0.1}, {.lr = 0.1, .weight_decay = 0.01}};
    else if constexpr (std::is_same_v<Opt, optim::momentum>)
        // Without a penalty the update is one fused pass (detail::momentum_pass), with one
        // the expressions.
        return {{.lr = 0.1},
                {.lr = 0.05, .momentum = 0.8, .nesterov = true},
                {.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.01}};
    else if constexpr (std::is_same_v<Opt, optim::adam>)
        return {{.lr = 0.01},
                {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1}};
    else
        return {{.lr = 0.01}, {.lr = 0.02, .beta1 = 0.85, .beta2 = 0.95, .weight_decay = 0.1}};
}

/// Five steps of each configuration of Opt on the static net of element type T, on every
/// mesh, against the serial run.
template <class Opt, class T>
void check_against_serial(double tol, bool away_from_zero = false) {
    for_each_world_mesh([&](const M& m) {
        for (const auto& o : configurations<Opt>()) {
            auto n = make_static_net<T>(m);
            auto s = serial_of(n);
            Opt opt(o);
            train(opt, n, 5, away_from_zero);
            train_serial(o, s, 5, away_from_zero);
            EXPECT_EQ(opt.steps(), 5);
            expect_matches(opt, n, s, tol, std::string(Opt::name) + " " + where(m));
        }
    });
}

TEST(optimizers, sgd_matches_the_serial_sgd) {
    check_against_serial<optim::sgd, double>(1e-12);
}

TEST(optimizers, momentum_matches_the_serial_momentum) {
    check_against_serial<optim::momentum, double>(1e-12);
}

TEST(optimizers, adam_matches_the_serial_adam) {
    check_against_serial<optim::adam, double>(1e-12);
}

TEST(optimizers, adamw_matches_the_serial_adamw) {
    check_against_serial<optim::adamw, double>(1e-12);
}

TEST(optimizers, float_weights_match_within_float_precision) {
    check_against_serial<optim::sgd, float>(1e-5);
    check_against_serial<optim::momentum, float>(1e-5);
    check_against_serial<optim::adam, float>(1e-5);
    check_against_serial<optim::adamw, float>(1e-5);
}

TEST(optimizers, sixteen_bit_weights_are_computed_in_float) {
    // A few 16-bit roundings per step (value, slots) on top of float's.
    const double half = 8 * std::ldexp(1.0, -10), bf = 8 * std::ldexp(1.0, -7);
    check_against_serial<optim::momentum, xshard::float16>(half, true);
    check_against_serial<optim::adam, xshard::float16>(half, true);
    check_against_serial<optim::adamw, xshard::bfloat16>(bf, true);
    check_against_serial<optim::sgd, xshard::bfloat16>(bf, true);
}

TEST(optimizers, any_parameter_container_is_stepped) {
    for_each_world_mesh([](const M& m) {
        std::map<std::string, xshard::weight<dyn2>> by_name;
        by_name.emplace("w", make_weight<dyn2>(m, "0.w", {6, 5}, layout("[mp, dp]")));
        std::vector<xshard::weight<dyn1>> list{make_weight<dyn1>(m, "1.0", {7}, layout("[dp]")),
                                               make_weight<dyn1>(m, "1.1", {2}, layout("[-]"))};
        auto both = std::tie(by_name, list);
        EXPECT_EQ(xshard::parameter_names(both), (std::vector<std::string>{"0.w", "1.0", "1.1"}));
        const optim::adam_options o{.lr = 0.03, .weight_decay = 0.01};
        auto s = serial_of(both);
        optim::adam opt(o);
        train(opt, both, 4);
        train_serial(o, s, 4);
        expect_matches(opt, both, s, 1e-12, where(m));
    });
}

// --- an optimizer of one's own ------------------------------------------------------------

/// Options of a user's rule: sign descent with a memory of the last signs.
struct sign_options {
    double lr = 0.1;
};

/// A user's update rule for optim::optimizer: w -= lr · sign(g), keeping sign(g) in slot
/// "last_sign". Nothing of xshard's but the public concept and update_locally's contract.
class sign_rule {
public:
    using options_type = sign_options;
    static constexpr std::string_view name = "sign_descent";
    static constexpr std::array<std::string_view, 1> slots{"last_sign"};

    explicit sign_rule(const sign_options& o)
        : options_(o) {}
    const sign_options& options() const noexcept { return options_; }

    template <class W>
    void update(W& w, double lr, std::int64_t) const {
        optim::update_locally(w, [&](auto& p, const auto& g, auto&& slot) {
            using C = typename std::remove_cvref_t<decltype(p)>::value_type;
            slot(0) = xt::sign(g);
            p -= C(lr) * slot(0);
        });
    }

private:
    sign_options options_;
};

static_assert(optim::update_rule<sign_rule>);
static_assert(!optim::update_rule<sign_options>);

void serial_update(const sign_options&, serial_weight& w, double lr, std::int64_t) {
    w.state.resize(1);
    w.state[0] = xt::sign(w.grad);
    w.value -= lr * w.state[0];
}

TEST(optimizers, a_users_rule_makes_an_optimizer) {
    using sign_descent = optim::optimizer<sign_rule>;
    for_each_world_mesh([](const M& m) {
        auto n = make_static_net<double>(m);
        auto s = serial_of(n);
        sign_descent opt({.lr = 0.05});
        train(opt, n, 3);
        train_serial(sign_options{.lr = 0.05}, s, 3);
        EXPECT_EQ(opt.steps(), 3);
        EXPECT_EQ(opt.options().lr, 0.05);
        expect_matches(opt, n, s, 1e-12, "sign_descent " + where(m));
        // Its state is the optimizer's: another optimizer refuses it.
        EXPECT_THROW(optim::adam().step(n), xshard::error) << where(m);
    });
}

// --- state_of and checkpoints -----------------------------------------------------------

template <class Opt>
std::vector<std::string> state_names() {
    std::vector<std::string> names;
    for (auto slot : Opt::slots)
        for (const auto& w : weight_names)
            names.push_back(std::string(slot) + "." + w);
    return names;
}

TEST(state_of, names_each_slot_then_the_weight_and_allocates_zeros) {
    const M m(world(), {world().size(), 1});
    auto n = make_static_net<double>(m);
    EXPECT_TRUE(xshard::parameter_names(optim::sgd().state_of(n)).empty());
    EXPECT_TRUE(n.dense1.weight.state.empty());

    EXPECT_EQ(xshard::parameter_names(optim::momentum().state_of(n)),
              state_names<optim::momentum>());
    ASSERT_EQ(n.embedding.state.size(), 1u);
    EXPECT_EQ(n.embedding.state[0].layout(), n.embedding.value.layout());
    EXPECT_EQ(n.embedding.state[0].shape(), n.embedding.value.shape());
    EXPECT_TRUE(xt::all(xt::equal(n.embedding.state[0].local(), 0.0))) << where(m);

    optim::clear_state(n);
    EXPECT_TRUE(n.embedding.state.empty());
    const optim::adam adam;
    EXPECT_EQ(xshard::parameter_names(adam.state_of(n)), state_names<optim::adam>());
    EXPECT_EQ(state_names<optim::adam>().front(), "adam_m.dense1.weight");
    EXPECT_EQ(state_names<optim::adam>().back(), "adam_v.embedding");
    const auto layouts = xshard::layouts_of(adam.state_of(n));
    EXPECT_EQ(layouts.at("adam_v.dense1.weight"), layout("[-, mp]"));
    EXPECT_EQ(layouts.at("adam_m.dense2.bias"), layout("[mp]"));
    // AdamW keeps the same slots: the state carries over.
    EXPECT_EQ(xshard::parameter_names(optim::adamw().state_of(n)), state_names<optim::adamw>());
}

/// Three steps on mesh (W, 1) with layouts_a, saved (integrated) with the optimizer's state
/// and step; loaded on every mesh of the world into a net with layouts_b and a fresh
/// optimizer; three more steps there must give what three more steps of the first run give,
/// and what six serial steps give.
template <class Opt>
void check_resume(const typename Opt::options_type& o) {
    const auto w = world();
    const std::string dir = shared_directory(w, XSHARD_OPTIM_SCRATCH);
    const std::string path = dir + "/ckpt.safetensors";
    auto a = make_dynamic_net(M(w, {w.size(), 1}), layouts_a);
    Opt opt_a(o);
    train(opt_a, a, 3);
    xshard::save_checkpoint(path, a, {.step = opt_a.steps()}, opt_a.state_of(a));
    train(opt_a, a, 3);
    auto s = serial_of(a);
    train_serial(o, s, 6);
    expect_matches(opt_a, a, s, 1e-12, "uninterrupted " + std::string(Opt::name));

    for_each_world_mesh([&](const M& m) {
        const std::string context = "resumed " + std::string(Opt::name) + " " + where(m);
        auto b = make_dynamic_net(m, layouts_b);
        Opt opt_b(o);
        const auto info = xshard::load_checkpoint(path, b, opt_b.state_of(b));
        EXPECT_EQ(info.step, 3) << context;
        opt_b.set_steps(info.step);
        train(opt_b, b, 3);
        EXPECT_EQ(opt_b.steps(), 6) << context;
        EXPECT_EQ(b.dense2.weight.value.layout(), layouts_b[2]);
        expect_matches(opt_b, b, s, 1e-12, context);
        // The same numbers as the uninterrupted run, whatever the layouts.
        std::vector<xt::xtensor<double, 2>> ra{xshard::gather_all(a.dense1.weight.value),
                                               xshard::gather_all(a.embedding.value)};
        std::vector<xt::xtensor<double, 2>> rb{xshard::gather_all(b.dense1.weight.value),
                                               xshard::gather_all(b.embedding.value)};
        EXPECT_TRUE(xt::allclose(ra[0], rb[0], 1e-12, 0) && xt::allclose(ra[1], rb[1], 1e-12, 0))
            << context;
    });
    xshard::mpi::barrier(w);
    if (w.rank() == 0)
        std::filesystem::remove_all(dir);
}

TEST(state_of, checkpoint_round_trip_resumes_every_optimizer) {
    check_resume<optim::sgd>({.lr = 0.1, .weight_decay = 0.01});
    check_resume<optim::momentum>({.lr = 0.05, .nesterov = true, .weight_decay = 0.01});
    check_resume<optim::adam>({.lr = 0.01, .weight_decay = 0.1});
    check_resume<optim::adamw>({.lr = 0.01});
}

// --- errors -------------------------------------------------------------------------------

using xshard::testing::expect_error;

TEST(errors, options_out_of_range) {
    expect_error([] { optim::sgd o({.lr = -1}); }, "xshard: sgd: lr must be a finite number >= 0, "
                                                   "not -1");
    expect_error([] { optim::sgd o({.weight_decay = -0.5}); }, "sgd: weight_decay must be");
    expect_error([] { optim::momentum o({.momentum = -0.9}); }, "momentum: momentum must be");
    expect_error([] { optim::adam o({.lr = std::nan("")}); }, "adam: lr must be a finite number");
    expect_error([] { optim::adam o({.beta1 = 1}); }, "adam: beta1 must lie in [0, 1), not 1");
    expect_error([] { optim::adamw o({.beta2 = -0.1}); }, "adamw: beta2 must lie in [0, 1)");
    expect_error([] { optim::adam o({.eps = -1e-8}); }, "adam: eps must be");
    expect_error([] { optim::adamw o({.weight_decay = -1}); }, "adamw: weight_decay must be");
    optim::adam opt;
    expect_error([&] { opt.set_steps(-1); }, "adam: the step count must be >= 0, not -1");
}

TEST(errors, misuse_at_a_step_changes_nothing) {
    const M m(world(), {xshard::auto_size, 1});
    auto n = make_static_net<double>(m);
    optim::momentum first;
    train(first, n, 1);
    const auto before = xshard::gather_all(n.dense1.weight.value);

    optim::momentum mo;
    expect_error([&] { mo.step(n, -0.1); }, "momentum: lr must be a finite number >= 0, not -0.1");
    EXPECT_EQ(mo.steps(), 0);

    // Momentum's slot, then Adam: a sentence naming the weight and the way out.
    optim::adam adam;
    expect_error([&] { adam.step(n); }, "adam: weight 'dense1.weight' has 1 state slot(s) but adam "
                                        "keeps 2 (adam_m, adam_v); another optimizer stepped it: "
                                        "xshard::optim::clear_state(model)");
    expect_error([&] { (void)adam.state_of(n); }, "weight 'dense1.weight' has 1 state slot(s)");
    optim::sgd sgd;
    expect_error([&] { sgd.step(n); }, "but sgd keeps 0;");
    EXPECT_EQ(adam.steps(), 0);
    EXPECT_EQ(sgd.steps(), 0);
    EXPECT_TRUE(xt::all(xt::equal(xshard::gather_all(n.dense1.weight.value), before)));
    optim::clear_state(n);
    adam.step(n);
    EXPECT_EQ(adam.steps(), 1);

    // A gradient or a slot of another layout than its value.
    auto d = make_dynamic_net(m, layouts_a);
    // Complete zero gradients: a fresh weight's gradient holds terms, which no step takes.
    xshard::for_each_weight(d, [](const std::string&, auto& w) {
        auto g = w.value;
        g.local().fill(0.0);
        w.set_gradient(std::move(g));
    });
    d.dense2.weight.grad = xshard::distribute<xshard::dynamic_layout(2)>(
        m, xt::xtensor<double, 2>(xt::zeros<double>({5, 3})), layout("[mp, -]"));
    optim::sgd plain;
    expect_error([&] { plain.step(d); }, "sgd: the gradient of weight 'dense2.weight' is [mp, -] "
                                         "(5, 3) but its value is [-, -] (5, 3)");
    d.dense2.weight.grad = xshard::distribute<xshard::dynamic_layout(2)>(
        m, xt::xtensor<double, 2>(xt::zeros<double>({5, 3})), layout("[-, -] partial(sum: dp)"));
    expect_error([&] { plain.step(d); },
                 "sgd: the gradient of weight 'dense2.weight' is partial [-, -] partial(sum: dp) "
                 "(5, 3); sum it over the weight's replicas (synchronize_gradients)");
    d.dense2.weight.grad = d.dense2.weight.value;
    (void)optim::adam().state_of(d);
    d.embedding.state[1] = xshard::distribute<xshard::dynamic_layout(2)>(
        m, xt::xtensor<double, 2>(xt::zeros<double>({9, 4})), layout("[-, -]"));
    expect_error([&] { adam.step(d); },
                 "adam: the state slot 'adam_v' of weight 'embedding' is [-, -] (9, 4) but its "
                 "value is [mp, dp] (9, 4)");
    EXPECT_EQ(adam.steps(), 1);
}

// --- schedules at run time ----------------------------------------------------------------

TEST(schedules, warmup_cosine_follows_its_formula) {
    constexpr double pi = std::numbers::pi;
    for (const auto& [warmup, total] :
         std::vector<std::pair<int, int>>{{0, 10}, {3, 10}, {5, 5}, {1, 2}, {4, 1000}}) {
        const optim::warmup_cosine s{
            .base_lr = 0.3, .warmup_steps = warmup, .total_steps = total, .min_lr = 0.01};
        for (int k = 0; k < total + 5; ++k) {
            const double want =
                k < warmup ? 0.3 * (k + 1) / warmup
                : k >= total
                    ? 0.01
                    : 0.01 +
                          0.29 * 0.5 * (1 + std::cos(pi * (k - warmup) / double(total - warmup)));
            EXPECT_NEAR(s(k), want, 1e-15) << "step " << k << " of " << warmup << "/" << total;
        }
    }
    for (int i = 0; i <= 1000; ++i) {
        const double x = pi * i / 1000;
        EXPECT_NEAR(xshard::detail::cos_0_pi(x), std::cos(x), 4e-16) << x;
    }
    EXPECT_EQ(optim::constant_lr{0.125}(123456), 0.125);
}

TEST(schedules, out_of_range_settings_throw) {
    expect_error([] { (void)optim::warmup_cosine{.base_lr = 1, .total_steps = 5}(-1); },
                 "warmup_cosine: the step must be >= 0, not -1");
    expect_error(
        [] { (void)optim::warmup_cosine{.base_lr = 1, .warmup_steps = 10, .total_steps = 5}(0); },
        "0 <= warmup_steps <= total_steps (warmup_steps 10, total_steps 5)");
    expect_error(
        [] { (void)optim::warmup_cosine{.base_lr = 0.1, .total_steps = 5, .min_lr = 1}(0); },
        "0 <= min_lr <= base_lr");
    expect_error([] { (void)optim::warmup_cosine{.base_lr = -1, .total_steps = 5}(0); },
                 "0 <= min_lr <= base_lr");
}

} // namespace
