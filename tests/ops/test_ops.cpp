// Operators with sharding rules against serial xtensor, for layouts drawn over every test
// mesh, uneven shapes included; misuse raises the same exception on every rank.

#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/embedding.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/normalize.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/ops/shape.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/expression.hpp>
#include <xshard/tensor/gather.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>

#include <cmath>
#include <random>
#include <string>
#include <type_traits>

namespace {

using xshard::dynamic_layout;
using xshard::layout;
using xshard::testing::all_layouts;
using xshard::testing::for_each_mesh;
using xshard::testing::where;

template <std::size_t N>
xt::xtensor<double, N> random_array(const std::array<std::size_t, N>& shape, unsigned seed,
                                    double lo = -1.0, double hi = 1.0) {
    std::mt19937 e(seed);
    return xt::random::rand<double>(shape, lo, hi, e);
}

/// A sample of `count` layouts (the same on every rank).
std::vector<layout> sample(const std::vector<layout>& all, std::size_t count, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<layout> out;
    std::uniform_int_distribution<std::size_t> pick(0, all.size() - 1);
    for (std::size_t i = 0; i < count; ++i)
        out.push_back(all[pick(rng)]);
    return out;
}

/// Whether `f` throws xshard::error; the ranks agree (every rank runs the same code).
template <class F>
bool throws(F&& f) {
    try {
        f();
        return false;
    } catch (const xshard::error&) {
        return true;
    }
}

TEST(matmul, every_layout_pair_matches_a_serial_product) {
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        const std::array<std::size_t, 2> sa{7, 10}, sb{10, 5};
        const auto ga = random_array(sa, 1), gb = random_array(sb, 2);
        const xt::xtensor<double, 2> expected = xt::linalg::dot(ga, gb);
        const auto layouts = all_layouts(m.shape(), 2, false);
        const auto as = sample(layouts, 24, 3), bs = sample(layouts, 24, 4);
        for (std::size_t i = 0; i < as.size(); ++i) {
            const auto a = xshard::distribute<dynamic_layout(2)>(m, ga, as[i]);
            const auto b = xshard::distribute<dynamic_layout(2)>(m, gb, bs[i]);
            const auto rule = xshard::matmul_rule(as[i], bs[i]);
            const std::string what = as[i].to_string() + " @ " + bs[i].to_string() + " " + where(m);
            if (rule.problem == xshard::rule_problem::none) {
                const auto c = xshard::ops::matmul(a, b);
                EXPECT_EQ(c.layout(), rule.out) << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(c), expected, 1e-12, 1e-12)) << what;
            } else {
                EXPECT_TRUE(throws([&] { (void)xshard::ops::matmul(a, b); })) << what;
            }
            // With redistributions allowed every pair works.
            const xshard::redistributing_mesh<M> rm(m);
            const auto ra = xshard::distribute<dynamic_layout(2)>(rm, ga, as[i]);
            const auto rb = xshard::distribute<dynamic_layout(2)>(rm, gb, bs[i]);
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::matmul(ra, rb)), expected,
                                     1e-12, 1e-12))
                << what << " (redistributing)";
        }
    });
}

TEST(matmul, transposed_operands_and_accumulation) {
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        // Stored as a^T [10, 7] and b^T [5, 10]: the product is a b = [7, 5].
        const auto gat = random_array(std::array<std::size_t, 2>{10, 7}, 11);
        const auto gbt = random_array(std::array<std::size_t, 2>{5, 10}, 12);
        const auto gb = random_array(std::array<std::size_t, 2>{10, 5}, 13);
        const xt::xtensor<double, 2> ga = xt::transpose(gat), gbt_t = xt::transpose(gbt);
        const xt::xtensor<double, 2> both = xt::linalg::dot(ga, gbt_t),
                                     left = xt::linalg::dot(ga, gb);
        const auto layouts = all_layouts(m.shape(), 2, false);
        const auto as = sample(layouts, 16, 14), bs = sample(layouts, 16, 15);
        const xshard::redistributing_mesh<M> rm(m);
        for (std::size_t i = 0; i < as.size(); ++i) {
            const auto at = xshard::distribute<dynamic_layout(2)>(m, gat, as[i]);
            const auto bt = xshard::distribute<dynamic_layout(2)>(m, gbt, bs[i]);
            const auto b = xshard::distribute<dynamic_layout(2)>(m, gb, bs[i]);
            const auto a_ = xshard::ops::transposed(at);
            EXPECT_EQ(a_.shape(), (std::array<std::size_t, 2>{7, 10}));
            const std::string what =
                as[i].to_string() + "^T @ " + bs[i].to_string() + " " + where(m);
            for (const bool transpose_b : {false, true}) {
                const auto& expected = transpose_b ? both : left;
                const auto rule = xshard::matmul_rule(
                    a_.layout(), transpose_b ? xshard::ops::transposed(bt).layout() : b.layout());
                auto product = [&] {
                    return transpose_b ? xshard::ops::matmul(a_, xshard::ops::transposed(bt))
                                       : xshard::ops::matmul(a_, b);
                };
                if (rule.problem != xshard::rule_problem::none) {
                    EXPECT_TRUE(throws([&] { (void)product(); })) << what;
                    continue;
                }
                auto c = product();
                EXPECT_EQ(c.layout(), rule.out) << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(c), expected, 1e-12, 1e-12)) << what;
                // Accumulating adds a second product into c.
                if (transpose_b)
                    xshard::ops::matmul(a_, xshard::ops::transposed(bt), c, {.accumulate = true});
                else
                    xshard::ops::matmul(a_, b, c, {.accumulate = true});
                EXPECT_TRUE(xt::allclose(xshard::gather_all(c), 2.0 * expected, 1e-12, 1e-12))
                    << what << " (accumulated)";
            }
            // With redistributions allowed every pair works.
            const auto rat = xshard::distribute<dynamic_layout(2)>(rm, gat, as[i]);
            const auto rbt = xshard::distribute<dynamic_layout(2)>(rm, gbt, bs[i]);
            EXPECT_TRUE(
                xt::allclose(xshard::gather_all(xshard::ops::matmul(xshard::ops::transposed(rat),
                                                                    xshard::ops::transposed(rbt))),
                             both, 1e-12, 1e-12))
                << what << " (redistributing)";
        }
    });
}

TEST(matmul, batched_and_shared_weights) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 3> sa{3, 5, 4}, sb{3, 4, 6};
        const std::array<std::size_t, 2> sw{4, 6};
        const auto ga = random_array(sa, 5), gb = random_array(sb, 6);
        const auto gw = random_array(sw, 7);
        for (const auto& l : sample(all_layouts(m.shape(), 3, false), 12, 8)) {
            // b laid out like a on the batch, replicated elsewhere: the rule slices it.
            layout lb = layout::replicated(3);
            lb.dims[0] = l.dims[0];
            const auto a = xshard::distribute<dynamic_layout(3)>(m, ga, l);
            const auto b = xshard::distribute<dynamic_layout(3)>(m, gb, lb);
            const auto w = xshard::distribute<dynamic_layout(2)>(m, gw, layout::replicated(2));
            const auto c = xshard::gather_all(xshard::ops::matmul(a, b));
            const auto cw = xshard::gather_all(xshard::ops::matmul(a, w));
            // b stored transposed per batch element ([3, 6, 4]), laid out like b.
            const xt::xtensor<double, 3> gbt = xt::transpose(gb, {0, 2, 1});
            auto lbt = lb;
            std::swap(lbt.dims[1], lbt.dims[2]);
            const auto bt = xshard::distribute<dynamic_layout(3)>(m, gbt, lbt);
            EXPECT_TRUE(xt::allclose(
                xshard::gather_all(xshard::ops::matmul(a, xshard::ops::transposed(bt))), c, 1e-12,
                1e-12))
                << l << " " << where(m);
            for (std::size_t i = 0; i < 3; ++i) {
                const xt::xtensor<double, 2> ai = xt::view(ga, i);
                const xt::xtensor<double, 2> bi = xt::view(gb, i);
                EXPECT_TRUE(xt::allclose(xt::view(c, i), xt::linalg::dot(ai, bi), 1e-12, 1e-12))
                    << l << " " << where(m);
                EXPECT_TRUE(xt::allclose(xt::view(cw, i), xt::linalg::dot(ai, gw), 1e-12, 1e-12))
                    << l << " " << where(m);
            }
        }
    });
}

TEST(elementwise, broadcasting_and_partial_sums_match_serial) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> sx{6, 5};
        const std::array<std::size_t, 1> sb{5};
        const auto gx = random_array(sx, 9), gy = random_array(sx, 10, 0.5, 1.5);
        const auto gb = random_array(sb, 11);
        const auto layouts = all_layouts(m.shape(), 2, false);
        const auto l1 = all_layouts(m.shape(), 1, false);
        for (const auto& lx : sample(layouts, 16, 12)) {
            const auto x = xshard::distribute<dynamic_layout(2)>(m, gx, lx);
            const auto y = xshard::distribute<dynamic_layout(2)>(m, gy, layout::replicated(2));
            const std::string what = lx.to_string() + " " + where(m);
            if (!lx.is_partial()) {
                EXPECT_TRUE(
                    xt::allclose(xshard::gather_all(xshard::ops::relu(x)), xt::maximum(gx, 0.0)))
                    << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::gelu(x)),
                                         0.5 * gx * (1.0 + xt::erf(gx / std::sqrt(2.0)))))
                    << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::sigmoid(x)),
                                         1.0 / (1.0 + xt::exp(-gx))))
                    << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::exp(x)), xt::exp(gx)))
                    << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::tanh(x)), xt::tanh(gx)))
                    << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::div(y, x)), gy / gx))
                    << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::maximum(x, y)),
                                         xt::maximum(gx, gy)))
                    << what;
            } else {
                EXPECT_TRUE(throws([&] { (void)xshard::ops::relu(x); })) << what;
                EXPECT_TRUE(throws([&] { (void)xshard::ops::mul(x, x); })) << what;
                EXPECT_TRUE(throws([&] { (void)xshard::ops::div(y, x); })) << what;
            }
            // Linear in pending sums: sums, scaling, negation; and a bias added once.
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::add(x, y)), gx + gy)) << what;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::mul(x, y)), gx * gy)) << what;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::div(x, y)), gx / gy)) << what;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::neg(x)), -gx)) << what;
            for (const auto& lb : l1) {
                if (lb.is_partial())
                    continue;
                const auto b = xshard::distribute<dynamic_layout(1)>(m, gb, lb);
                const auto rule =
                    xshard::elementwise_rule(lx, lb, xshard::elementwise_kind::additive);
                if (rule.problem == xshard::rule_problem::none)
                    EXPECT_TRUE(
                        xt::allclose(xshard::gather_all(xshard::ops::bias_add(x, b)), gx + gb))
                        << what << " + " << lb;
                else
                    EXPECT_TRUE(throws([&] { (void)xshard::ops::bias_add(x, b); }))
                        << what << " + " << lb;
            }
        }
        // Broadcasting an extent-1 dimension against a split one.
        const std::array<std::size_t, 2> s1{6, 1};
        const auto g1 = random_array(s1, 13);
        const auto x = xshard::distribute<dynamic_layout(2)>(m, gx, layouts.front());
        const auto c = xshard::distribute<dynamic_layout(2)>(m, g1, layout::replicated(2));
        EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::mul(x, c)), gx * g1)) << where(m);
    });
}

/// What `f` throws, after the "xshard: <operation>: " prefix ("" if it throws nothing).
template <class F>
std::string sentence_of(F&& f) {
    try {
        f();
        return "";
    } catch (const xshard::error& e) {
        const std::string w = e.what();
        const auto colon = w.find(": ", std::string("xshard: ").size());
        return colon == std::string::npos ? w : w.substr(colon + 2);
    }
}

TEST(elementwise, lazy_operators_and_operations_share_one_rule) {
    // a + a, a * a, a / a lazily (tensor/expression.hpp) and by xshard::ops: allowed on the
    // same layouts, with the same values, refused with the same sentence.
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> sx{6, 5};
        const auto gx = random_array(sx, 21, 0.5, 1.5);
        for (const auto& lx : all_layouts(m.shape(), 2, true)) {
            const auto x = xshard::distribute<dynamic_layout(2)>(m, gx, lx);
            const std::string what = lx.to_string() + " " + where(m);
            using T = xshard::dtensor<double, std::remove_cvref_t<decltype(m)>, dynamic_layout(2)>;
            const auto lazy_sum = sentence_of([&] { (void)T(x + x); });
            const auto lazy_product = sentence_of([&] { (void)T(x * x); });
            const auto lazy_quotient = sentence_of([&] { (void)T(x / x); });
            EXPECT_EQ(lazy_sum, sentence_of([&] { (void)xshard::ops::add(x, x); })) << what;
            EXPECT_EQ(lazy_product, sentence_of([&] { (void)xshard::ops::mul(x, x); })) << what;
            EXPECT_EQ(lazy_quotient, sentence_of([&] { (void)xshard::ops::div(x, x); })) << what;
            if (!lx.is_partial()) {
                EXPECT_EQ(lazy_product, "") << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(T(x * x)), gx * gx)) << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::mul(x, x)), gx * gx))
                    << what;
            } else if (lx.op == xshard::reduction::sum) {
                EXPECT_EQ(lazy_sum, "") << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(T(x + x)), 2.0 * gx)) << what;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::add(x, x)), 2.0 * gx))
                    << what;
                EXPECT_NE(lazy_product.find("both operands of a product are partial"),
                          std::string::npos)
                    << what << ": " << lazy_product;
                EXPECT_NE(lazy_quotient.find("cannot enter a non-linear operation"),
                          std::string::npos)
                    << what << ": " << lazy_quotient;
                // Only the lazy form cannot keep a scalar on one term of the sum.
                EXPECT_NE(
                    sentence_of([&] { (void)T(x + 1.0); }).find("a scalar added to a partial"),
                    std::string::npos)
                    << what;
            } else {
                EXPECT_NE(lazy_sum.find("nor a pending max or min any arithmetic"),
                          std::string::npos)
                    << what << ": " << lazy_sum;
            }
        }
    });
}

// Sums along the leading dimension of a row-major block add its rows (ops/reduce.hpp).
static_assert(xshard::detail::row_major_container<xt::xtensor<double, 3>>);
static_assert(
    !xshard::detail::row_major_container<xt::xtensor<double, 3, xt::layout_type::column_major>>);

TEST(reduce, every_dimension_of_every_layout) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 3> s{5, 3, 7};
        const auto g = random_array(s, 14);
        for (const auto& l : sample(all_layouts(m.shape(), 3, false), 20, 15)) {
            const auto t = xshard::distribute<dynamic_layout(3)>(m, g, l);
            const std::string what = l.to_string() + " " + where(m);
            EXPECT_TRUE(xt::allclose(
                xshard::gather_all(xshard::ops::resolve(xshard::ops::sum<1>(t))), xt::sum(g, {1})))
                << what;
            EXPECT_TRUE(xt::allclose(
                xshard::gather_all(xshard::ops::resolve(xshard::ops::mean<2, true>(t))),
                xt::mean(g, {2}, xt::keep_dims)))
                << what;
            if (!l.is_partial()) {
                EXPECT_TRUE(
                    xt::allclose(xshard::gather_all(xshard::ops::resolve(xshard::ops::max<0>(t))),
                                 xt::amax(g, {0})))
                    << what;
                EXPECT_TRUE(
                    xt::allclose(xshard::gather_all(xshard::ops::resolve(xshard::ops::min<2>(t))),
                                 xt::amin(g, {2})))
                    << what;
            } else {
                EXPECT_TRUE(throws([&] { (void)xshard::ops::max<0>(t); })) << what;
            }
            // A sum along a split dimension is partial over its axes, until resolved. Along
            // the leading dimension each block's rows are added row by row.
            const auto p = xshard::ops::sum<0>(t);
            for (const auto& a : l.dims[0])
                EXPECT_TRUE(p.layout().partial.contains(a)) << what;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::resolve(p)), xt::sum(g, {0})))
                << what;
            EXPECT_TRUE(xt::allclose(
                xshard::gather_all(xshard::ops::resolve(xshard::ops::mean<0, true>(t))),
                xt::mean(g, {0}, xt::keep_dims)))
                << what;
        }
    });
}

TEST(normalize, pooled_moments_equal_two_pass_statistics_of_every_ranks_data) {
    // Rank r holds (5r + 2) mod 7 values per channel (none on rank 1), around a mean far
    // larger than the spread (a one-pass sum of squares would lose the variance); the pooled
    // means and variances equal a serial two-pass computation over all ranks' values.
    const auto world = xshard::communicator::world();
    const std::size_t p = std::size_t(world.size()), c = 3;
    auto count_of = [](std::size_t r) {
        return (5 * r + 2) % 7;
    };
    auto value = [](std::size_t r, std::size_t k, std::size_t i) {
        return 1e4 * double(k + 1) + 10 * std::sin(double(7 * r + 3 * i + k));
    };
    std::vector<double> means(c, 0.0), m2(c, 0.0);
    const std::size_t me = std::size_t(world.rank()), n = count_of(me);
    for (std::size_t k = 0; k < c; ++k) {
        for (std::size_t i = 0; i < n; ++i)
            means[k] += value(me, k, i);
        means[k] = n ? means[k] / double(n) : 0.0;
        for (std::size_t i = 0; i < n; ++i)
            m2[k] += (value(me, k, i) - means[k]) * (value(me, k, i) - means[k]);
    }
    const double total =
        xshard::detail::pooled_moments(world, double(n), std::span(means), std::span(m2));
    std::size_t all = 0;
    for (std::size_t r = 0; r < p; ++r)
        all += count_of(r);
    EXPECT_EQ(total, double(all));
    for (std::size_t k = 0; k < c; ++k) {
        double mean = 0, var = 0;
        for (std::size_t r = 0; r < p; ++r)
            for (std::size_t i = 0; i < count_of(r); ++i)
                mean += value(r, k, i);
        mean /= double(all);
        for (std::size_t r = 0; r < p; ++r)
            for (std::size_t i = 0; i < count_of(r); ++i)
                var += (value(r, k, i) - mean) * (value(r, k, i) - mean);
        var /= double(all);
        EXPECT_NEAR(means[k], mean, 1e-12 * mean) << "channel " << k;
        EXPECT_NEAR(m2[k], var, 1e-10 * var) << "channel " << k;
        EXPECT_GT(var, 0.01) << "channel " << k; // the spread is not lost
    }
}

TEST(normalize, softmax_layer_norm_batch_norm_along_split_dimensions) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> s{6, 9};
        const auto g = random_array(s, 16, -3.0, 3.0);
        const xt::xtensor<double, 2> mx = xt::amax(g, {1}, xt::keep_dims);
        const xt::xtensor<double, 2> e = xt::exp(g - mx);
        const xt::xtensor<double, 2> se = xt::sum(e, {1}, xt::keep_dims);
        const xt::xtensor<double, 2> mu1 = xt::mean(g, {1}, xt::keep_dims);
        const xt::xtensor<double, 2> var1 = xt::mean((g - mu1) * (g - mu1), {1}, xt::keep_dims);
        const xt::xtensor<double, 2> mu0 = xt::mean(g, {0}, xt::keep_dims);
        const xt::xtensor<double, 2> var0 = xt::mean((g - mu0) * (g - mu0), {0}, xt::keep_dims);
        for (const auto& l : all_layouts(m.shape(), 2, false)) {
            if (l.is_partial())
                continue;
            const auto t = xshard::distribute<dynamic_layout(2)>(m, g, l);
            const std::string what = l.to_string() + " " + where(m);
            EXPECT_TRUE(
                xt::allclose(xshard::gather_all(xshard::ops::softmax<1>(t)), e / se, 1e-12, 1e-14))
                << what;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::log_softmax<1>(t)),
                                     g - mx - xt::log(se), 1e-12, 1e-14))
                << what;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::layer_norm<1>(t)),
                                     (g - mu1) / xt::sqrt(var1 + 1e-5), 1e-12, 1e-12))
                << what;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::batch_norm(t)),
                                     (g - mu0) / xt::sqrt(var0 + 1e-5), 1e-12, 1e-12))
                << what;
        }
    });
}

TEST(vocab_parallel, embedding_and_cross_entropy) {
    for_each_mesh([](const auto& m) {
        const std::size_t V = 11, H = 4, B = 7;
        const auto table = random_array(std::array<std::size_t, 2>{V, H}, 17);
        const auto logits = random_array(std::array<std::size_t, 2>{B, V}, 18, -2.0, 2.0);
        xt::xtensor<int, 1> ids = xt::xtensor<int, 1>::from_shape({B});
        for (std::size_t i = 0; i < B; ++i)
            ids(i) = int((i * 5 + 3) % V);
        // Serial references.
        xt::xtensor<double, 2> rows = xt::xtensor<double, 2>::from_shape({B, H});
        xt::xtensor<double, 1> loss = xt::xtensor<double, 1>::from_shape({B});
        for (std::size_t i = 0; i < B; ++i) {
            xt::view(rows, i) = xt::view(table, std::size_t(ids(i)));
            const double mx = xt::amax(xt::view(logits, i))();
            loss(i) = std::log(xt::sum(xt::exp(xt::view(logits, i) - mx))()) + mx -
                      logits(i, std::size_t(ids(i)));
        }
        for (const auto& lt : all_layouts(m.shape(), 2, false)) {
            if (lt.is_partial())
                continue;
            const std::string what = lt.to_string() + " " + where(m);
            const auto t = xshard::distribute<dynamic_layout(2)>(m, table, lt);
            const auto i = xshard::distribute<dynamic_layout(1)>(m, ids, layout::replicated(1));
            EXPECT_TRUE(
                xt::allclose(xshard::gather_all(xshard::ops::embedding(i, t)), rows, 1e-14, 1e-14))
                << what;
            const auto x = xshard::distribute<dynamic_layout(2)>(m, logits, lt);
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::cross_entropy(x, i)), loss,
                                     1e-12, 1e-12))
                << what;
        }
        // A label out of range raises on every rank.
        xt::xtensor<int, 1> bad = ids;
        if (B > 0)
            bad(B - 1) = int(V);
        const auto x = xshard::distribute<dynamic_layout(2)>(m, logits, layout::replicated(2));
        const auto b = xshard::distribute<dynamic_layout(1)>(m, bad, layout::replicated(1));
        EXPECT_TRUE(throws([&] { (void)xshard::ops::cross_entropy(x, b); })) << where(m);
    });
}

TEST(shape_ops, transpose_and_reshape) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 3> s{4, 3, 2};
        const auto g = random_array(s, 19);
        for (const auto& l : all_layouts(m.shape(), 3, false)) {
            const auto t = xshard::distribute<dynamic_layout(3)>(m, g, l);
            const auto tt = xshard::ops::transpose<2, 0, 1>(t);
            EXPECT_EQ(xshard::gather_all(tt), xt::transpose(g, {2, 0, 1})) << l << " " << where(m);
        }
        // [4, 3, 2] split on dim 0 -> [4, 6] split the same way: local when 4 divides.
        const int p = m.size();
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(m)>, xshard::mesh<"x">>) {
            if (4 % p == 0) {
                const auto t = xshard::distribute<"[x, -, -]">(m, g);
                const auto r = xshard::ops::reshape<"[x, -]">(t, std::array<std::size_t, 2>{4, 6});
                EXPECT_EQ(xshard::gather_all(r), xt::reshape_view(g, {4, 6}));
                // Merging the split dimension into a later one cannot follow.
                if (p > 1) {
                    EXPECT_TRUE(throws([&] {
                        (void)xshard::ops::reshape<"[-, x]">(t, std::array<std::size_t, 2>{4, 6});
                    }));
                }
            }
        }
    });
}

} // namespace
