// shard() in its two modes, with typed, run-time and strategy specs, parameter plans and
// dataset strategies, against serial xtensor.

#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/redistribute/meter.hpp>
#include <xshard/shard/shard.hpp>
#include <xshard/tensor/gather.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <random>

namespace {

using xshard::layout;
using xshard::none;
using xshard::spec;
using xshard::strategy;
using xshard::testing::world;
using M = xshard::mesh<"dp", "mp">;

M make_mesh() {
    const auto w = world();
    return M(w, {xshard::auto_size, w.size() % 2 == 0 ? 2 : 1});
}

template <std::size_t N>
xt::xtensor<double, N> random_array(const std::array<std::size_t, N>& shape, unsigned seed) {
    std::mt19937 e(seed);
    return xt::random::rand<double>(shape, -1.0, 1.0, e);
}

TEST(shard, global_semantics_with_layout_types) {
    const auto m = make_mesh();
    const auto gx = random_array<2>({9, 6}, 1), gw = random_array<2>({6, 5}, 2);
    const xt::xtensor<double, 2> expected = xt::linalg::dot(gx, gw);
    auto f = xshard::shard(
        m, [](const auto& x, const auto& w) { return xshard::ops::matmul(x, w); },
        std::tuple(spec<"[dp, -]">, spec<"[-, mp]">), spec<"[dp, mp]">);
    const auto x = xshard::distribute<"[-, -]">(m, gx);
    const auto y = f(x, gw);
    static_assert(std::is_same_v<decltype(y), const xshard::dtensor<double, M, "[dp, mp]">>);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(y), expected));
    // A contraction split over mp: a pending sum, resolved by the output spec.
    auto g = xshard::shard(
        m, [](const auto& x, const auto& w) { return xshard::ops::matmul(x, w); },
        std::tuple(spec<"[-, mp]">, none), spec<"[-, -]">);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(g(x, gw)), expected));
}

TEST(shard, inputs_already_laid_out_are_passed_by_reference) {
    const auto m = make_mesh();
    const auto x = xshard::distribute<"[dp, mp]">(m, random_array<2>({4, 4}, 3));
    const double* seen = nullptr;
    auto f = xshard::shard(
        m,
        [&](const auto& t) {
            seen = t.local().data();
            return xshard::ops::neg(t);
        },
        std::tuple(spec<"[dp, mp]">));
    (void)f(x);
    EXPECT_EQ(seen, x.local().data());
}

TEST(shard, strategies_and_automatic_redistribution) {
    // dense_relu with in_strategy ((p/2, 2), None, None), as MindSpore's functional shard.
    const auto m = make_mesh();
    const int p = m.size();
    const auto gx = random_array<2>({32, 16}, 4), gw = random_array<2>({16, 10}, 5);
    const auto gb = random_array<1>({10}, 6);
    const xt::xtensor<double, 2> expected = xt::maximum(xt::linalg::dot(gx, gw) + gb, 0.0);
    auto dense_relu = [](const auto& x, const auto& w, const auto& b) {
        return xshard::ops::relu(xshard::ops::bias_add(xshard::ops::matmul(x, w), b));
    };
    const strategy s{p / m.axis_size<"mp">(), m.axis_size<"mp">()};
    // Without the option the pending sum reaching relu is an error, on every rank.
    auto strict = xshard::shard(m, dense_relu, std::tuple(s, none, none));
    if (m.axis_size<"mp">() > 1) {
        EXPECT_THROW((void)strict(gx, gw, gb), xshard::error);
    }
    auto f = xshard::shard(m, dense_relu, std::tuple(s, none, none), spec<"[-, -]">,
                           xshard::auto_redistribute);
    f.traced();
    EXPECT_TRUE(xt::allclose(xshard::gather_all(f(gx, gw, gb)), expected));
    const layout lx = xshard::resolve(s, m.shape());
    const std::string moved = lx == layout("[-, -]") ? " (kept)" : " -> " + lx.to_string();
    EXPECT_NE(f.describe().find("input 0 (array held whole): [-, -]" + moved), std::string::npos)
        << f.describe();
}

TEST(shard, local_semantics_declare_partial_outputs) {
    // The hybrid net of MindSpore's distributed training tutorial: x @ weight-slice, reduce the
    // last axis, the sum pending over mp.
    const auto m = make_mesh();
    const auto gx = random_array<2>({7, 12}, 7), gw = random_array<2>({12, 8}, 8);
    const xt::xtensor<double, 1> expected = xt::sum(xt::linalg::dot(gx, gw), {1});
    auto hybrid = xshard::shard_local(
        m,
        [](const auto& x, const auto& w) {
            return xt::xtensor<double, 1>(xt::sum(xt::linalg::dot(x, w), {1}));
        },
        std::tuple(spec<"[-, -]">, spec<"[-, mp]">), spec<"[-] partial(sum: mp)">);
    const auto y = hybrid(gx, gw);
    EXPECT_EQ(y.shape()[0], 7u);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(y), expected));
    // Rows over dp (uneven: 7 rows), declared at run time.
    auto rows = xshard::shard_local(
        m, [](const auto& x) { return xt::xtensor<double, 2>(2.0 * x); },
        std::tuple(spec<"[dp, -]">), layout("[dp, -]"));
    EXPECT_TRUE(xt::allclose(xshard::gather_all(rows(gx)), 2.0 * gx));
}

TEST(shard, a_local_result_that_contradicts_its_layout_throws_everywhere) {
    const auto m = make_mesh();
    if (m.axis_size<"dp">() < 2)
        GTEST_SKIP() << "needs dp > 1";
    auto bad = xshard::shard_local(
        m,
        [&](const auto& x) {
            // Rank 0 claims one row too many.
            const std::size_t rows = x.shape()[0] + (m.rank() == 0 ? 2 : 0);
            return xt::xtensor<double, 2>(xt::zeros<double>({rows, x.shape()[1]}));
        },
        std::tuple(spec<"[dp, -]">), spec<"[dp, -]">);
    EXPECT_THROW((void)bad(random_array<2>({8, 3}, 9)), xshard::error);
}

TEST(shard, tuples_and_arguments_that_are_not_tensors) {
    const auto m = make_mesh();
    const auto gx = random_array<2>({6, 4}, 10);
    auto f = xshard::shard(
        m,
        [](const auto& x, double factor) {
            return std::tuple(
                xshard::ops::resolve(xshard::ops::sum<1>(x)),
                xshard::ops::mul(x, xshard::full<double, "[-, -]">(x.mesh(), {1, 1}, factor)));
        },
        std::tuple(spec<"[dp, mp]">, none), std::tuple(spec<"[-]">, spec<"[-, -]">));
    const auto [s, scaled] = f(gx, 3.0);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(s), xt::sum(gx, {1})));
    EXPECT_TRUE(xt::allclose(xshard::gather_all(scaled), 3.0 * gx));
}

TEST(shard, parameter_plans_lay_parameters_out_once_and_agree) {
    const auto m = make_mesh();
    const auto gw = random_array<2>({6, 4}, 11);
    xshard::parameter w{"dense.weight",
                        xshard::distribute<xshard::dynamic_layout(2)>(m, gw, layout("[-, -]"))};
    auto use = [](const auto& x, const auto& weight) {
        return xshard::ops::matmul(x, weight);
    };
    auto f = xshard::shard(m, use, std::tuple(spec<"[-, -]">, none), spec<"[-, -]">,
                           xshard::parameter_plan{{"dense.weight", layout("[-, mp]")}});
    const auto gx = random_array<2>({3, 6}, 12);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(f(gx, w)), xt::linalg::dot(gx, gw)));
    EXPECT_EQ(w.value.layout(), layout("[-, mp]")); // laid out in place
    // A second shard() planning another layout for the same parameter.
    auto g = xshard::shard(m, use, std::tuple(spec<"[-, -]">, none), spec<"[-, -]">,
                           xshard::parameter_plan{{"dense.weight", layout("[mp, -]")}});
    try {
        (void)g(gx, w);
        ADD_FAILURE() << "no error";
    } catch (const xshard::error& e) {
        EXPECT_STREQ(e.what(),
                     "xshard: parameter 'dense.weight' is laid out [-, mp] by one shard() "
                     "and [mp, -] by another");
    }
}

/// A module of one dense layer, nested: its weight is "layer.weight".
struct dense_layer {
    xshard::weight<xshard::dtensor<double, M, xshard::dynamic_layout(2)>> weight;
    friend void visit_parameters(dense_layer& d, auto&& visit) { visit("weight", d.weight); }
};
struct network {
    dense_layer layer;
    friend void visit_parameters(network& n, auto&& visit) { visit("layer", n.layer); }
};

TEST(shard, parameter_plans_reach_a_module_s_weights_by_dotted_name) {
    // MindSpore's Cell.shard(..., parameter_plan={"self.layer.weight": ...}): the module is
    // passed to the call, and the plan lays its weight out in place, by its dotted name with
    // or without "self.". A plan naming nothing raises on every rank, naming it.
    const auto m = make_mesh();
    const auto gw = random_array<2>({6, 4}, 21);
    const auto gx = random_array<2>({3, 6}, 22);
    auto use = [](const auto& x, network& net) {
        return xshard::ops::matmul(x, net.layer.weight.value);
    };
    for (const char* name : {"self.layer.weight", "layer.weight"}) {
        network net{
            {xshard::weight(xshard::distribute<xshard::dynamic_layout(2)>(m, gw, "[-, -]"))}};
        auto f = xshard::shard(m, use, std::tuple(spec<"[-, -]">, none), spec<"[-, -]">,
                               xshard::parameter_plan{{name, layout("[-, mp]")}});
        EXPECT_TRUE(xt::allclose(xshard::gather_all(f(gx, net)), xt::linalg::dot(gx, gw)));
        EXPECT_EQ(net.layer.weight.value.layout(), layout("[-, mp]")) << name;
        EXPECT_EQ(net.layer.weight.grad.layout(), net.layer.weight.term_layout()) << name;
        EXPECT_TRUE(xt::allclose(xshard::gather_all(f(gx, net)), xt::linalg::dot(gx, gw)));
    }
    network net{{xshard::weight(xshard::distribute<xshard::dynamic_layout(2)>(m, gw, "[-, -]"))}};
    auto g = xshard::shard(m, use, std::tuple(spec<"[-, -]">, none), spec<"[-, -]">,
                           xshard::parameter_plan{{"layer.weight", layout("[-, mp]")},
                                                  {"layer.bias", layout("[mp]")}});
    try {
        (void)g(gx, net);
        ADD_FAILURE() << "no error";
    } catch (const xshard::error& e) {
        EXPECT_STREQ(e.what(), "xshard: the parameter plan names 'layer.bias', which no "
                               "parameter passed to the sharded callable has");
    }
}

TEST(shard, dataset_strategy_splits_the_batch_of_inputs_and_outputs) {
    const auto m = make_mesh().with_dataset_strategy(xshard::dataset_strategy::data_parallel, "dp");
    const auto gx = random_array<2>({10, 3}, 13);
    auto f = xshard::shard(
        m, [](const auto& x) { return xshard::ops::relu(x); }, std::tuple(none));
    f.traced();
    const auto y = f(gx);
    EXPECT_EQ(y.layout(), layout("[dp, -]")) << f.describe();
    EXPECT_TRUE(xt::allclose(xshard::gather_all(y), xt::maximum(gx, 0.0)));
    const auto full = make_mesh().with_dataset_strategy(xshard::dataset_strategy::full_batch);
    auto g = xshard::shard(
        full, [](const auto& x) { return xshard::ops::relu(x); },
        std::tuple(strategy{full.size(), 1}));
    EXPECT_EQ(g(gx).layout(), layout("[-, -]"));
}

/// What the failing callable of the agreement tests throws: not an xshard::error, so that
/// the test tells the thrower's own exception from the one the other ranks raise.
struct user_failure : std::exception {
    const char* what() const noexcept override { return "the user's callable failed"; }
};

/// Calls `f()`, which must throw on every rank: `user_failure` on the rank that threw it
/// (the last one), an xshard::error naming that rank on the others.
template <class F>
void expect_agreed_failure(const M& m, F&& f) {
    const int thrower = m.size() - 1;
    try {
        f();
        ADD_FAILURE() << "rank " << m.rank() << " returned normally";
    } catch (const user_failure&) {
        EXPECT_EQ(m.rank(), thrower) << "rank " << m.rank() << " got the thrower's exception";
    } catch (const xshard::error& e) {
        EXPECT_NE(m.rank(), thrower);
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(thrower) + " failed"),
                  std::string::npos)
            << "rank " << m.rank() << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("the user's callable failed"), std::string::npos)
            << "rank " << m.rank() << ": " << e.what();
    }
}

TEST(shard, a_callable_that_throws_on_one_rank_raises_on_every_rank) {
    const auto m = make_mesh();
    const auto gx = random_array<2>({6, 4}, 14);
    const auto x = xshard::distribute<"[dp, mp]">(m, gx);
    const bool throws_here = m.rank() == m.size() - 1;
    // Global semantics, an output that must be all-gathered after the callable.
    auto global = xshard::shard(
        m,
        [&](const auto& t) {
            if (throws_here)
                throw user_failure();
            return xshard::ops::neg(t);
        },
        std::tuple(spec<"[dp, mp]">), spec<"[-, -]">);
    expect_agreed_failure(m, [&] { (void)global(x); });
    // No collective after the callable at all: the others must still not return normally.
    auto kept = xshard::shard(
        m,
        [&](const auto& t) {
            if (throws_here)
                throw user_failure();
            return xshard::ops::neg(t);
        },
        std::tuple(spec<"[dp, mp]">));
    expect_agreed_failure(m, [&] { (void)kept(x); });
    // Local semantics: the global shapes of the results are gathered after the callable.
    auto local = xshard::shard_local(
        m,
        [&](const auto& t) {
            if (throws_here)
                throw user_failure();
            return xt::xtensor<double, 2>(2.0 * t);
        },
        std::tuple(spec<"[dp, -]">), spec<"[dp, -]">);
    expect_agreed_failure(m, [&] { (void)local(gx); });
    // Every rank is still in step: the same callables work afterwards.
    auto fine = xshard::shard_local(
        m, [](const auto& t) { return xt::xtensor<double, 2>(2.0 * t); },
        std::tuple(spec<"[dp, -]">), spec<"[dp, -]">);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(fine(gx)), 2.0 * gx));
}

TEST(shard, a_throw_between_two_collectives_raises_on_every_rank) {
    xshard::testing::quiet_failures quiet;
    const auto m = make_mesh();
    const auto gx = random_array<2>({6, 4}, 15);
    const auto x = xshard::distribute<"[dp, mp]">(m, gx);
    const bool throws_here = m.rank() == m.size() - 1;
    // The callable all-reduces, throws on the last rank, then all-reduces again: the others
    // wait in the second all-reduce until the failure notice ends it. Thrown after both
    // all-reduces first: then no collective is left waiting.
    for (const bool at_the_end : {true, false}) {
        auto f = xshard::shard(
            m,
            [&](const auto& t) {
                double s = 1;
                xshard::mpi::allreduce(m.comm(), std::span(&s, 1), xshard::reduction::sum);
                EXPECT_EQ(s, double(m.size()));
                if (throws_here && !at_the_end)
                    throw user_failure();
                xshard::mpi::allreduce(m.comm(), std::span(&s, 1), xshard::reduction::sum);
                if (throws_here)
                    throw user_failure();
                return xshard::ops::neg(t);
            },
            std::tuple(spec<"[dp, mp]">), spec<"[-, -]">);
        const auto c = m.comm();
        expect_agreed_failure(m, [&] { (void)f(x); });
        // Only a collective left waiting breaks the mesh's communicator.
        EXPECT_EQ(c.broken(), m.size() > 1 && !at_the_end);
    }
    // The mesh cannot be used again; a new one can.
    EXPECT_EQ(m.comm().broken(), m.size() > 1);
    const auto fresh = make_mesh();
    auto fine = xshard::shard(
        fresh, [](const auto& t) { return xshard::ops::neg(t); }, std::tuple(spec<"[dp, mp]">),
        spec<"[-, -]">);
    EXPECT_TRUE(
        xt::allclose(xshard::gather_all(fine(xshard::distribute<"[dp, mp]">(fresh, gx))), -gx));
}

TEST(shard, one_callable_serves_float_and_double_tensors_of_one_layout) {
    // The plan of a redistribution is cached per input and output; a plan made for float
    // tensors must not serve double ones of the same layouts and shape (it would move half
    // the bytes, or overrun a buffer).
    const auto m = make_mesh();
    const auto gx = random_array<2>({9, 7}, 15);
    const xt::xtensor<float, 2> gf = xt::cast<float>(gx);
    auto f = xshard::shard(
        m, [](const auto& t) { return xshard::ops::neg(t); }, std::tuple(layout("[dp, mp]")),
        layout("[-, -]"));
    for (int round = 0; round < 2; ++round) {
        const auto xf = xshard::distribute<"[-, -]">(m, gf);
        const auto xd = xshard::distribute<"[-, -]">(m, gx);
        const auto yf = f(xf);
        const auto yd = f(xd);
        static_assert(
            std::is_same_v<typename std::remove_cvref_t<decltype(yf)>::value_type, float>);
        EXPECT_TRUE(xt::allclose(xshard::gather_all(yf), xt::xtensor<float, 2>(-gf)))
            << "rank " << m.rank() << ", round " << round;
        EXPECT_TRUE(xt::allclose(xshard::gather_all(yd), -gx)) << "rank " << m.rank() << ", round "
                                                               << round;
    }
}

} // namespace

namespace {

/// The same text on every rank of `m`.
bool agreed_text(const M& m, const std::string& s) {
    const auto h = static_cast<unsigned long long>(std::hash<std::string>{}(s));
    return xshard::value_ranges<1>(m.comm(), {h})[0].agrees();
}

/// The communication the planner predicts for one call of `f` (the maximum over the ranks),
/// or -1 when the call raises.
template <class F>
double predicted_communication(const M& m, F&& f) {
    std::array<double, 2> v{0, 0}; // failed, seconds
    try {
        xshard::redistribution_meter meter;
        f();
        v[1] = meter.seconds();
    } catch (const std::exception&) {
        v[0] = 1;
    }
    xshard::mpi::allreduce(m.comm(), v, xshard::reduction::max);
    return v[0] != 0 ? -1 : v[1];
}

} // namespace

TEST(shard, sharding_propagation_derives_the_none_inputs_by_level) {
    const auto m = make_mesh();
    const bool mp = m.axis_size<"mp">() > 1;
    const auto gx = random_array<2>({12, 8}, 16), gw = random_array<2>({8, 6}, 17);
    const xt::xtensor<double, 2> expected = xt::linalg::dot(gx, gw);
    int calls = 0;
    auto mm = [&calls](const auto& x, const auto& w) {
        ++calls;
        return xshard::ops::matmul(x, w);
    };
    const auto x = xshard::distribute<"[-, -]">(m, gx);
    const auto w = xshard::distribute<"[-, -]">(m, gw);
    // Level 0: the weight kept whole: no communication at all (splitting its columns would
    // need the output's columns gathered).
    auto least_communication =
        xshard::shard(m, mm, std::tuple(spec<"[dp, -]">, none), spec<"[dp, -]">,
                      xshard::sharding_propagation{.level = 0});
    least_communication.traced();
    const auto y0 = least_communication(x, w);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(y0), expected));
    const auto& d0 = least_communication.derived_layouts();
    ASSERT_EQ(d0.size(), 2u);
    EXPECT_FALSE(d0[0].has_value()); // a spec was given
    ASSERT_TRUE(d0[1].has_value());
    EXPECT_EQ(*d0[1], layout("[-, -]")) << least_communication.describe();
    EXPECT_NE(least_communication.describe().find("input 1 derived (level 0"), std::string::npos)
        << least_communication.describe();
    // Level 1: the weight's columns split over mp (the only split matmul's rule accepts
    // beside x's rows over dp), from arrays every rank holds whole.
    auto least_memory = xshard::shard(m, mm, std::tuple(spec<"[dp, -]">, none), spec<"[dp, -]">,
                                      xshard::sharding_propagation{.level = 1});
    const auto y1 = least_memory(gx, gw);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(y1), expected));
    ASSERT_TRUE(least_memory.derived_layouts()[1].has_value());
    EXPECT_EQ(*least_memory.derived_layouts()[1], mp ? layout("[-, mp]") : layout("[-, -]"));
    // Derived once per layouts, shapes and element type: the next call runs fn once.
    calls = 0;
    EXPECT_TRUE(xt::allclose(xshard::gather_all(least_memory(gx, gw)), expected));
    EXPECT_EQ(calls, 1);
    // Another shape is derived again (the candidates run fn, then the call itself).
    const auto gw2 = random_array<2>({8, 10}, 18);
    calls = 0;
    EXPECT_TRUE(xt::allclose(xshard::gather_all(least_memory(gx, gw2)),
                             xt::xtensor<double, 2>(xt::linalg::dot(gx, gw2))));
    EXPECT_GT(calls, 1);
    // Level 2, measured: whatever it picks, the result is exact and every rank picked it.
    auto fastest = xshard::shard(m, mm, std::tuple(none, none), spec<"[-, -]">,
                                 xshard::sharding_propagation{.level = 2});
    EXPECT_TRUE(xt::allclose(xshard::gather_all(fastest(x, w)), expected));
    for (const auto& d : fastest.derived_layouts()) {
        ASSERT_TRUE(d.has_value());
        EXPECT_TRUE(agreed_text(m, d->to_string())) << d->to_string();
    }
}

TEST(shard, sharding_propagation_at_level_0_finds_the_least_communication_of_all_layouts) {
    // One derived input, every candidate also tried as a given spec: the derived layout's
    // predicted communication is the least of the layouts the call accepts.
    const auto m = make_mesh();
    const auto gx = random_array<2>({16, 12}, 19), gw = random_array<2>({12, 9}, 20);
    const xt::xtensor<double, 2> expected = xt::maximum(xt::linalg::dot(gx, gw), 0.0);
    auto dense = [](const auto& x, const auto& w) {
        return xshard::ops::relu(xshard::ops::matmul(x, w));
    };
    const auto x = xshard::distribute<"[(dp, mp), -]">(m, gx);
    auto derived = xshard::shard(m, dense, std::tuple(none, spec<"[mp, -]">), spec<"[dp, -]">,
                                 xshard::sharding_propagation{.level = 0},
                                 xshard::auto_redistribute);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(derived(x, gw)), expected));
    const layout chosen = *derived.derived_layouts()[0];
    auto cost_of = [&](const layout& l) {
        auto given = xshard::shard(m, dense, std::tuple(l, spec<"[mp, -]">), spec<"[dp, -]">,
                                   xshard::auto_redistribute);
        (void)given(x, gw); // plans built
        return predicted_communication(m, [&] { (void)given(x, gw); });
    };
    const double best = cost_of(chosen);
    ASSERT_GE(best, 0.0) << chosen.to_string();
    int feasible = 0;
    for (const char* l : {"[-, -]", "[dp, -]", "[mp, -]", "[-, dp]", "[-, mp]", "[(dp, mp), -]",
                          "[(mp, dp), -]", "[-, (dp, mp)]", "[-, (mp, dp)]", "[dp, mp]",
                          "[mp, dp]"}) {
        const double c = cost_of(layout(l));
        if (c < 0)
            continue;
        ++feasible;
        EXPECT_LE(best, c * (1 + 1e-9) + 1e-15) << chosen.to_string() << " against " << l;
    }
    EXPECT_GE(feasible, 1);
}

TEST(shard, sharding_propagation_keeps_errors_agreed_and_checks_its_level) {
    const auto m = make_mesh();
    const auto gx = random_array<2>({6, 4}, 21);
    const bool throws_here = m.rank() == m.size() - 1;
    // Every candidate fails on one rank: the call raises as it would without derivation.
    auto failing = xshard::shard(
        m,
        [&](const auto& t) {
            if (throws_here)
                throw user_failure();
            return xshard::ops::neg(t);
        },
        std::tuple(none), spec<"[-, -]">, xshard::sharding_propagation{.level = 2});
    expect_agreed_failure(m, [&] { (void)failing(gx); });
    EXPECT_THROW((void)xshard::shard(
                     m, [](const auto& t) { return t; }, std::tuple(none), none,
                     xshard::sharding_propagation{.level = 3}),
                 xshard::error);
    auto neg = xshard::shard(
        m, [](const auto& t) { return xshard::ops::neg(t); }, std::tuple(none), spec<"[-, -]">,
        xshard::sharding_propagation{.level = 1});
    // Arrays held whole whose shapes differ between ranks: raised on every rank, before any
    // rank derives.
    if (m.size() > 1) {
        const auto mine = random_array<2>({m.rank() == 0 ? 7u : 6u, 4}, 22);
        EXPECT_THROW((void)neg(mine), xshard::error);
    }
    // The ranks are in step afterwards.
    EXPECT_TRUE(xt::allclose(xshard::gather_all(neg(gx)), -gx));
}
