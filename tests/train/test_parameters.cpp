// Parameter containers, parameter broadcast, gradient synchronisation and norms, against
// values every rank can compute alone.

#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/broadcast.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/norms.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <range/v3/view/all.hpp>
#include <range/v3/view/take.hpp>
#include <xtensor/xrandom.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <unistd.h>
#include <unordered_map>

namespace {

using xshard::layout;
using xshard::testing::for_each_mesh;
using xshard::testing::where;
using xshard::testing::world;

template <class M>
using dyn = xshard::dtensor<double, M, xshard::dynamic_layout(2)>;

/// A tensor whose every element is `value(rank, i)` on this rank.
template <class T, class M, class F>
auto filled(const M& m, std::array<std::size_t, 2> shape, const layout& l, F value) {
    auto t = xshard::zeros<T, xshard::dynamic_layout(2)>(m, shape, l);
    for (std::size_t i = 0; i < t.local().size(); ++i)
        t.local().data()[i] = T(value(m.rank(), i));
    return t;
}

// --- containers -------------------------------------------------------------------------

struct dense {
    xshard::dtensor<double, xshard::mesh<"dp", "mp">, "[-, mp]"> weight;
    xshard::dtensor<float, xshard::mesh<"dp", "mp">, "[mp]"> bias;
    friend void visit_parameters(dense& d, auto&& visit) {
        visit("weight", d.weight);
        visit("bias", d.bias);
    }
};

struct block {
    dense dense1, dense2;
    friend void visit_parameters(block& b, auto&& visit) {
        visit("dense1", b.dense1);
        visit("dense2", b.dense2);
    }
};

struct model {
    std::vector<block> blocks;
    friend void visit_parameters(model& m, auto&& visit) { visit("block", m.blocks); }
};

TEST(containers, every_kind_enumerates_its_parameters_with_dotted_names) {
    const auto w = world();
    if (w.size() % 2)
        GTEST_SKIP() << "needs an even number of ranks";
    using M = xshard::mesh<"dp", "mp">;
    const M m(w, {xshard::auto_size, 2});
    auto d = [&] {
        return dense{xshard::zeros<double, "[-, mp]">(m, {4, 4}),
                     xshard::zeros<float, "[mp]">(m, {4})};
    };
    model net{{block{d(), d()}, block{d(), d()}}};
    EXPECT_EQ(xshard::parameter_names(net),
              (std::vector<std::string>{"block.0.dense1.weight", "block.0.dense1.bias",
                                        "block.0.dense2.weight", "block.0.dense2.bias",
                                        "block.1.dense1.weight", "block.1.dense1.bias",
                                        "block.1.dense2.weight", "block.1.dense2.bias"}));
    std::map<std::string, dyn<M>> map{
        {"b", filled<double>(m, {2, 2}, layout("[-, -]"), [](int, std::size_t) { return 1; })},
        {"a", filled<double>(m, {2, 2}, layout("[dp, -]"), [](int, std::size_t) { return 1; })}};
    EXPECT_EQ(xshard::parameter_names(map), (std::vector<std::string>{"a", "b"}));
    std::unordered_map<std::string, dyn<M>> umap(map.begin(), map.end());
    EXPECT_EQ(xshard::parameter_names(umap).size(), 2u);
    std::vector<xshard::parameter<dyn<M>>> list{{"x", map.at("a")}, {"y", map.at("b")}};
    EXPECT_EQ(xshard::parameter_names(list), (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(xshard::parameter_names(ranges::views::all(list) | ranges::views::take(1)),
              (std::vector<std::string>{"x"}));
    auto mixed = std::tuple(xshard::parameter{"f", xshard::zeros<float, "[-]">(m, {3})},
                            xshard::parameter{"g", xshard::zeros<double, "[dp]">(m, {3})});
    EXPECT_EQ(xshard::parameter_names(mixed), (std::vector<std::string>{"f", "g"}));
    const auto layouts = xshard::layouts_of(net);
    EXPECT_EQ(layouts.at("block.1.dense2.bias"), layout("[mp]"));
}

// --- parameter broadcast ----------------------------------------------------------------

/// The value rank r starts with at element i of a parameter: distinct for every rank.
double start(int rank, std::size_t i) {
    return 1000.0 * (rank + 1) + double(i);
}

TEST(parameter_broadcast, every_redundant_copy_takes_its_owners_values) {
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        std::map<std::string, dyn<M>> params;
        const auto all = xshard::testing::all_layouts(m.shape(), 2, false);
        for (std::size_t k = 0; k < all.size(); ++k)
            if (!all[k].is_partial())
                params.emplace("p" + std::to_string(100 + k),
                               filled<double>(m, {5, 7 + k % 3}, all[k], start));
        // Bucketed (the default) and one parameter per collective.
        for (double fusion : {64.0, 0.0}) {
            for (auto& [name, t] : params)
                for (std::size_t i = 0; i < t.local().size(); ++i)
                    t.local().data()[i] = start(m.rank(), i);
            const auto report = xshard::parameter_broadcast(
                params, {.cur_rank = world().rank(), .initial_rank = 0, .fusion_mib = fusion});
            for (auto& [name, t] : params) {
                const int owner = report.owner.at(name);
                const auto repl = t.layout().replicated_axes(m.shape());
                if (m.shape().group_size(repl) == 1) {
                    EXPECT_EQ(owner, -1) << name;
                } else {
                    // Every member of the group holds the owner's starting values.
                    EXPECT_NE(
                        std::find(m.group_ranks(repl).begin(), m.group_ranks(repl).end(), owner),
                        m.group_ranks(repl).end())
                        << name << " " << where(m);
                }
                const int from = owner < 0 ? m.rank() : owner;
                for (std::size_t i = 0; i < t.local().size(); ++i)
                    ASSERT_EQ(t.local().data()[i], start(from, i))
                        << name << " " << t.layout() << " " << where(m);
            }
            // Owners are balanced: no rank originates more than the largest parameter more
            // than another.
            const auto [lo, hi] =
                std::minmax_element(report.bytes_owned.begin(), report.bytes_owned.end());
            std::size_t largest = 0;
            for (auto& [name, t] : params)
                largest =
                    std::max(largest, t.local().size() * sizeof(double) * std::size_t(m.size()));
            EXPECT_LE(*hi - *lo, largest) << where(m);
            if (fusion == 0) { // one collective per redundant parameter
                std::size_t redundant = 0;
                for (const auto& [name, owner] : report.owner)
                    redundant += owner >= 0 ? 1 : 0;
                EXPECT_EQ(report.buckets, redundant) << where(m);
            }
        }
    });
}

TEST(parameter_broadcast, mixed_element_types_and_nested_modules) {
    const auto w = world();
    if (w.size() % 2)
        GTEST_SKIP() << "needs an even number of ranks";
    using M = xshard::mesh<"dp", "mp">;
    const M m(w, {xshard::auto_size, 2});
    auto params = std::tuple(
        xshard::parameter{"f", xshard::full<float, "[-]">(m, {5}, float(m.rank()))},
        xshard::parameter{"d", xshard::full<double, "[-, -]">(m, {3, 4}, double(m.rank()))});
    const auto report = xshard::parameter_broadcast(params);
    EXPECT_EQ(report.buckets, 2u); // one per element type
    const float f = std::get<0>(params).value.local()(0);
    EXPECT_EQ(f, float(report.owner.at("f")));
    for (float x : std::get<0>(params).value.local())
        EXPECT_EQ(x, f);
}

TEST(parameter_broadcast, errors_are_raised_on_every_rank_before_any_data_moves) {
    const auto w = world();
    const xshard::mesh<"x"> m(w, {w.size()});
    std::map<std::string, xshard::dtensor<double, xshard::mesh<"x">, xshard::dynamic_layout(2)>>
        params{{"w",
                xshard::full<double, xshard::dynamic_layout(2)>(m, {4, 4}, 1.0, layout("[-, -]"))}};
    auto message = [&](xshard::broadcast_options o) -> std::string {
        try {
            xshard::parameter_broadcast(params, o);
            return "";
        } catch (const xshard::error& e) {
            return e.what();
        }
    };
    // A wrong cur_rank on the last rank only.
    const int last = w.size() - 1;
    EXPECT_EQ(message({.cur_rank = w.rank() == last ? w.rank() + 1 : w.rank()}),
              "xshard: parameter_broadcast: cur_rank " + std::to_string(last + 1) +
                  " is not this process's rank " + std::to_string(last));
    // initial_rank must start the pipeline stage (2 stages when the ranks allow).
    if (w.size() % 2 == 0 && w.size() > 1) {
        EXPECT_NE(message({.initial_rank = 0, .pipeline_stages = 2}), "");
        EXPECT_EQ(message({.initial_rank = w.rank() / (w.size() / 2) * (w.size() / 2),
                           .pipeline_stages = 2}),
                  "");
    }
    EXPECT_NE(message({.initial_rank = 1}).find("is not the first rank"), std::string::npos);
    // A layout dictionary naming a parameter the container does not have.
    EXPECT_EQ(
        message({.layouts = xshard::layout_dict{{"nope", layout("[-, -]")}}}),
        "xshard: the layout dictionary names parameter 'nope', which the container does not have");
    // A shard resized on rank 0 only.
    if (w.rank() == 0)
        params.at("w").local() = xt::zeros<double>({3, 3});
    EXPECT_NE(message({}).find("has a local shard of shape (3, 3)"), std::string::npos);
}

// --- gradients --------------------------------------------------------------------------

TEST(gradients, sum_and_mean_over_the_redundant_copies) {
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        std::map<std::string, dyn<M>> params;
        std::map<std::string, xshard::dtensor<std::int64_t, M, xshard::dynamic_layout(2)>> ints;
        std::map<std::string, dyn<M>> grads;
        const auto all = xshard::testing::all_layouts(m.shape(), 2, false);
        for (std::size_t k = 0; k < all.size(); ++k) {
            if (all[k].is_partial())
                continue;
            const auto name = "g" + std::to_string(100 + k);
            params.emplace(name, filled<double>(m, {6, 5}, all[k], start));
            grads.emplace(name, filled<double>(m, {6, 5}, all[k], [](int r, std::size_t i) {
                              return 0.25 * r + double(i);
                          }));
            ints.emplace(name, filled<std::int64_t>(m, {6, 5}, all[k], [](int r, std::size_t i) {
                             return std::int64_t(r * 1000 + int(i));
                         }));
        }
        auto sums = grads;
        xshard::synchronize_gradients(params, sums);
        auto means = grads;
        xshard::synchronize_gradients(params, means, {.mean = true});
        xshard::synchronize_gradients(
            params, ints, {.fusion = {.allreduce = {xshard::fusion_threshold::mode::size, 0}}});
        // Overlapped: gradients marked ready in backward order.
        auto overlapped = grads;
        xshard::gradient_synchronizer sync(params, overlapped);
        for (auto it = params.rbegin(); it != params.rend(); ++it)
            sync.ready(it->first);
        sync.wait();
        for (auto& [name, p] : params) {
            const auto repl = p.layout().replicated_axes(m.shape());
            const auto members = m.group_ranks(repl);
            for (std::size_t i = 0; i < p.local().size(); ++i) {
                double s = 0;
                std::int64_t si = 0;
                for (int r : members) {
                    s += 0.25 * r + double(i);
                    si += r * 1000 + std::int64_t(i);
                }
                EXPECT_NEAR(sums.at(name).local().data()[i], s, 1e-12 * std::abs(s))
                    << name << " " << where(m);
                EXPECT_NEAR(means.at(name).local().data()[i], s / double(members.size()),
                            1e-12 * std::abs(s))
                    << name;
                EXPECT_EQ(ints.at(name).local().data()[i], si) << name << " " << where(m);
                EXPECT_NEAR(overlapped.at(name).local().data()[i], s, 1e-12 * std::abs(s)) << name;
            }
        }
    });
}

TEST(gradients, float32_communication_of_16_bit_gradients_is_more_accurate) {
    const auto w = world();
    const xshard::mesh<"dp"> m(w, {w.size()});
    if (m.size() < 3)
        GTEST_SKIP() << "needs 3 ranks or more: with 2 a float16 sum rounds only once too";
    // Means of values that float16 cannot hold exactly: in float16 every addition of the
    // reduction rounds, in float32 only the final result does.
    auto value = [](int r, std::size_t i) {
        return 1.0f + float(r) * 0.0137f + float(i) * 0.00071f;
    };
    auto p = xshard::zeros<double, "[-]">(m, {512});
    auto make = [&] {
        auto g = xshard::zeros<xshard::float16, "[-]">(m, {512});
        for (std::size_t i = 0; i < 512; ++i)
            g.local()(i) = xshard::float16(value(m.rank(), i));
        return g;
    };
    auto half = std::tuple(xshard::parameter{"g", make()});
    auto wide = std::tuple(xshard::parameter{"g", make()});
    const auto params = std::tuple(xshard::parameter{"g", p});
    xshard::synchronize_gradients(params, half, {.mean = true});
    xshard::synchronize_gradients(params, wide, {.mean = true, .fp32_communication = true});
    double error_half = 0, error_wide = 0;
    for (std::size_t i = 0; i < 512; ++i) {
        double exact = 0;
        for (int r = 0; r < m.size(); ++r)
            exact += double(float(xshard::float16(value(r, i))));
        exact /= m.size();
        error_half += std::abs(double(float(std::get<0>(half).value.local()(i))) - exact);
        error_wide += std::abs(double(float(std::get<0>(wide).value.local()(i))) - exact);
    }
    EXPECT_LT(error_wide, error_half);
    // float32 communication rounds once: within half a float16 ulp (2^-11 near 1) everywhere.
    EXPECT_LE(error_wide / 512, std::ldexp(1.0, -11));
}

TEST(float16, conversions_round_to_nearest_even) {
    EXPECT_EQ(float(xshard::float16(1.0f)), 1.0f);
    EXPECT_EQ(float(xshard::float16(65504.0f)), 65504.0f);
    EXPECT_TRUE(std::isinf(float(xshard::float16(70000.0f))));
    EXPECT_EQ(float(xshard::float16(1.0f + 1.0f / 2048)), 1.0f);                     // tie -> even
    EXPECT_EQ(float(xshard::float16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);       // tie -> even
    EXPECT_EQ(float(xshard::float16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24)); // subnormal
    EXPECT_EQ(float(xshard::bfloat16(1.0f + 1.0f / 256)), 1.0f);                     // tie -> even
    EXPECT_EQ(float(xshard::bfloat16(3.0f)), 3.0f);
    for (std::uint16_t b = 0; b < 0x7c00; ++b) // every finite half round-trips
        ASSERT_EQ(xshard::float16(float(xshard::float16::from_bits(b))).bits, b);
}

// --- norms ------------------------------------------------------------------------------

TEST(norms, the_global_norm_counts_every_element_once) {
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        std::map<std::string, dyn<M>> grads;
        double serial = 0;
        const auto all = xshard::testing::all_layouts(m.shape(), 2, false);
        for (std::size_t k = 0; k < all.size(); ++k) {
            if (all[k].is_partial())
                continue;
            std::mt19937 e{unsigned(k)};
            const xt::xtensor<double, 2> g = xt::random::rand<double>({4, 3}, -1.0, 1.0, e);
            grads.emplace("g" + std::to_string(k),
                          xshard::distribute<xshard::dynamic_layout(2)>(m, g, all[k]));
            serial += xt::sum(g * g)();
        }
        EXPECT_NEAR(xshard::global_norm(grads), std::sqrt(serial), 1e-12) << where(m);
        const double before = xshard::clip_by_global_norm(grads, 0.5);
        EXPECT_NEAR(before, std::sqrt(serial), 1e-12);
        EXPECT_NEAR(xshard::global_norm(grads), std::min(0.5, std::sqrt(serial)), 1e-12);
        const auto local = xshard::local_norms(grads);
        EXPECT_EQ(local.size(), grads.size());
    });
}

TEST(norms, local_norms_are_printed_and_dumped_per_rank) {
    const auto w = world();
    const xshard::mesh<"x"> m(w, {w.size()});
    std::map<std::string, xshard::dtensor<double, xshard::mesh<"x">, "[x]">> grads{
        {"w", xshard::full<double, "[x]">(m, {std::size_t(2 * w.size())}, 3.0)}};
    std::ostringstream out;
    xshard::print_local_norm(grads, out);
    char norm[32];
    std::snprintf(norm, sizeof norm, "%.9g", std::sqrt(18.0));
    EXPECT_EQ(out.str(), "rank " + std::to_string(w.rank()) + " w " + norm + "\n");
    const auto dir =
        std::filesystem::temp_directory_path() / ("xshard_norms_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    xshard::dump_local_norm(grads, dir.string(), 7);
    std::ifstream in(dir / ("local_norm_rank" + std::to_string(w.rank()) + ".txt"));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, std::string("7 w ") + norm);
    std::filesystem::remove_all(dir);
}

} // namespace
