// Gradient synchronisation (train/gradients.hpp): sums and means over the redundant copies
// of every layout, bucketed, per tensor and overlapped; 16-bit gradients communicated in
// float32; buckets all-reduced through shared memory (fused ones on the gradients, unpacked),
// gradients in node storage read in place.

#include <xshard/core/node_shared.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/train/gradients.hpp>

#include "expect_error.hpp"
#include "layouts.hpp"
#include "mpi_test.hpp"
#include "parameters.hpp"
#include "traffic.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>

namespace {

using xshard::layout;
using xshard::testing::dyn;
using xshard::testing::filled;
using xshard::testing::for_each_mesh;
using xshard::testing::start;
using xshard::testing::where;
using xshard::testing::world;

/// A parameter and a gradient of `shape` in every layout of `m`'s matrices without pending
/// sums ("g100", "g101", ...), the parameters filled with `start`, the gradients with
/// `gradient`.
template <class M, class F = double (*)(int, std::size_t)>
void every_layout(const M& m, std::array<std::size_t, 2> shape,
                  std::map<std::string, dyn<M>>& params, std::map<std::string, dyn<M>>& grads,
                  F gradient = start) {
    const auto all = xshard::testing::all_layouts(m.shape(), 2, false);
    for (std::size_t k = 0; k < all.size(); ++k) {
        if (all[k].is_partial())
            continue;
        const auto name = "g" + std::to_string(100 + k);
        params.emplace(name, filled<double>(m, shape, all[k], start));
        grads.emplace(name, filled<double>(m, shape, all[k], gradient));
    }
}

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
        const auto int_terms = ints;
        xshard::synchronize_gradients(
            params, ints, {.fusion = {.allreduce = {xshard::fusion_threshold::mode::size, 0}}});
        // Overlapped: gradients marked ready in backward order.
        auto overlapped = grads;
        xshard::gradient_synchronizer sync(params, overlapped);
        for (auto it = params.rbegin(); it != params.rend(); ++it)
            sync.ready(it->first);
        sync.wait();
        // Kept synchronizers averaging fused buckets, through shared memory (reduced on the
        // gradients, divided on the way) and through messages, twice each (the second run
        // reuses the windows and buffers); integers too.
        auto kept_shared = grads, kept_messages = grads;
        auto int_means = int_terms;
        xshard::gradient_synchronizer shared_mean(params, kept_shared, {.mean = true});
        xshard::gradient_synchronizer message_mean(params, kept_messages,
                                                   {.mean = true, .shared_memory = false});
        xshard::gradient_synchronizer int_mean(params, int_means, {.mean = true});
        for (int run = 0; run < 2; ++run) {
            if (run == 1) {
                kept_shared = grads, kept_messages = grads;
                int_means = int_terms;
            }
            shared_mean.synchronize();
            message_mean.synchronize();
            int_mean.synchronize();
        }
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
                const double mean = s / double(members.size());
                EXPECT_NEAR(kept_shared.at(name).local().data()[i], mean, 1e-12 * std::abs(s))
                    << name << " " << where(m);
                EXPECT_NEAR(kept_messages.at(name).local().data()[i], mean, 1e-12 * std::abs(s))
                    << name << " " << where(m);
                EXPECT_EQ(int_means.at(name).local().data()[i],
                          std::int64_t(double(si) / double(members.size())))
                    << name << " " << where(m);
            }
        }
    });
}

TEST(gradients, a_gradient_type_that_cannot_be_summed_raises_on_every_rank) {
    // int16 has an MPI datatype but no synchronisation path: the synchronizer knows the
    // element types from the containers and every rank raises before any bucket runs.
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        using short_tensor = xshard::dtensor<std::int16_t, M, xshard::dynamic_layout(2)>;
        const layout l = xshard::testing::all_layouts(m.shape(), 2, false).front();
        std::map<std::string, short_tensor> params, grads;
        params.emplace("w", filled<std::int16_t>(m, {4, 3}, l, start));
        grads.emplace("w", filled<std::int16_t>(m, {4, 3}, l, start));
        xshard::testing::expect_error(
            [&] { xshard::gradient_synchronizer sync(params, grads); },
            "gradients must be float, double, float16, bfloat16, int32 or int64");
    });
}

TEST(gradients, a_kept_synchronizer_follows_gradients_whose_storage_was_replaced) {
    for_each_mesh([](const auto& m) {
        using M = std::remove_cvref_t<decltype(m)>;
        std::map<std::string, dyn<M>> params;
        std::map<std::string, dyn<M>> grads;
        every_layout(m, {5, 3}, params, grads);
        xshard::gradient_synchronizer sync(
            params, grads,
            {.fusion = {.allreduce = {xshard::fusion_threshold::mode::size,
                                      3e-4}}}); // small buckets, several
        for (int step = 0; step < 3; ++step) {
            // Every step the backward pass hands over new storage (as a non-noalias `+=`
            // does): the old buffers are freed.
            for (auto& [name, g] : grads) {
                auto fresh = g.local();
                for (std::size_t i = 0; i < fresh.size(); ++i)
                    fresh.data()[i] = double(step) + 0.5 * m.rank() + double(i);
                g.local() = std::move(fresh);
            }
            if (step == 1)
                sync.synchronize();
            else {
                for (auto it = params.rbegin(); it != params.rend(); ++it)
                    sync.ready(it->first);
                sync.wait();
            }
            for (auto& [name, p] : params) {
                const auto members = m.group_ranks(p.layout().replicated_axes(m.shape()));
                for (std::size_t i = 0; i < p.local().size(); ++i) {
                    double s = 0;
                    for (int r : members)
                        s += double(step) + 0.5 * r + double(i);
                    EXPECT_NEAR(grads.at(name).local().data()[i], s, 1e-12 * (1 + s))
                        << name << " step " << step << " " << where(m);
                }
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

} // namespace

TEST(gradients, index_fusion_closes_buckets_at_the_given_parameters) {
    const auto w = world();
    using M = xshard::mesh<"x">;
    const M m(w, {w.size()});
    std::map<std::string, dyn<M>> params, grads;
    for (const char* name : {"a", "b", "c", "d", "e"}) {
        params.emplace(name, filled<double>(m, {3, 2}, layout("[-, -]"), start));
        grads.emplace(name, filled<double>(m, {3, 2}, layout("[-, -]"), [](int r, std::size_t i) {
                          return double(r) + double(i);
                      }));
    }
    using mode = xshard::fusion_threshold::mode;
    const xshard::gradient_options o{.fusion = {.allreduce = {mode::index, 0, {2, 4}}}};
    xshard::gradient_synchronizer sync(params, grads, o);
    // Parameters 0-1, 2-3 and 4: three all-reduces (none on one rank: nothing to sum).
    EXPECT_EQ(sync.buckets(), w.size() > 1 ? 3U : 0U);
    sync.synchronize();
    const double ranks = double(w.size()) * double(w.size() - 1) / 2;
    for (auto& [name, g] : grads)
        for (std::size_t i = 0; i < g.local().size(); ++i)
            EXPECT_DOUBLE_EQ(g.local().data()[i], ranks + double(w.size()) * double(i)) << name;
    // Indices must increase strictly inside (0, parameters): every rank raises.
    for (const auto& bad : {std::vector<std::size_t>{0}, std::vector<std::size_t>{3, 2},
                            std::vector<std::size_t>{5}}) {
        auto copy = grads;
        xshard::testing::expect_error(
            [&] {
                xshard::gradient_synchronizer(params, copy,
                                              {.fusion = {.allreduce = {mode::index, 0, bad}}});
            },
            "index mode needs strictly increasing");
    }
}

namespace {

/// Synchronises integer-valued gradients of every layout of `m`'s tensors with a kept
/// synchronizer (blocking, then overlapped) and checks the sums exactly; fused buckets and
/// (with `fusion_bytes` 0) one bucket per parameter, reduced on the gradient itself. Returns
/// the bytes sent through MPI point to point by the synchronisations and the synchronizers'
/// staging bytes.
template <class M>
std::pair<unsigned long long, std::size_t> sync_exact(const M& m, double fusion_bytes,
                                                      bool shared_memory = true) {
    std::map<std::string, dyn<M>> params, grads;
    every_layout(m, {6, 5}, params, grads);
    xshard::gradient_options options;
    options.shared_memory = shared_memory;
    if (fusion_bytes >= 0)
        options.fusion.allreduce = {xshard::fusion_threshold::mode::size, fusion_bytes};
    xshard::gradient_synchronizer sync(params, grads, options);
    // The test world is one node: every bucket's group shares it, unless the transport is
    // off (XSHARD_SHARED_MEMORY=0) or not asked for.
    const bool one_node = xshard::node_group(world()).whole_communicator_shares_memory();
    EXPECT_EQ(sync.uses_shared_memory(), shared_memory && one_node && sync.buckets() > 0)
        << where(m);
    unsigned long long sent = 0;
    for (int step = 0; step < 2; ++step) {
        for (auto& [name, g] : grads)
            for (std::size_t i = 0; i < g.local().size(); ++i)
                g.local().data()[i] = double(step * 7 + m.rank() * 1000 + int(i));
        xshard::testing::traffic::reset();
        if (step == 0)
            sync.synchronize();
        else {
            for (auto it = params.rbegin(); it != params.rend(); ++it)
                sync.ready(it->first);
            sync.wait();
        }
        sent += xshard::testing::traffic::sent();
        for (auto& [name, p] : params) {
            const auto members = m.group_ranks(p.layout().replicated_axes(m.shape()));
            for (std::size_t i = 0; i < p.local().size(); ++i) {
                double s = 0;
                for (int r : members)
                    s += double(step * 7 + r * 1000 + int(i));
                EXPECT_EQ(grads.at(name).local().data()[i], s)
                    << name << " step " << step << " " << where(m);
            }
        }
    }
    // The one-off form keeps messages, exact too: the sums summed again.
    auto again = grads;
    xshard::synchronize_gradients(params, again, options);
    for (auto& [name, p] : params) {
        const auto members = m.group_ranks(p.layout().replicated_axes(m.shape()));
        for (std::size_t i = 0; i < p.local().size(); ++i)
            EXPECT_EQ(again.at(name).local().data()[i],
                      grads.at(name).local().data()[i] * double(members.size()))
                << name << " " << where(m);
    }
    return {sent, sync.node_staging_bytes()};
}

/// Whether every rank of the world has the shared-memory transport and an open arena.
bool open_everywhere(const xshard::node_storage& storage) {
    int ok =
        storage.is_open() && xshard::node_group(world()).whole_communicator_shares_memory() ? 1 : 0;
    xshard::mpi::allreduce(world(), std::span(&ok, 1), xshard::reduction::min);
    return ok == 1;
}

TEST(gradients, gradients_in_node_storage_are_read_in_place) {
    // Node storage open and the gradients in it (node_shared meshes): every bucket is summed
    // through shared memory, exact, not a byte through MPI; a bucket of one parameter is
    // read in place (no staging window), fused buckets stage the others' parts.
    xshard::node_storage storage(world(), 8 << 20);
    const bool everywhere = open_everywhere(storage);
    for_each_mesh([&](const auto& plain) {
        const xshard::node_shared<std::remove_cvref_t<decltype(plain)>> m(plain);
        for (double fusion : {-1.0, 0.0}) { // fused buckets; one per parameter
            const auto [sent, staging] = sync_exact(m, fusion);
            if (everywhere) {
                EXPECT_EQ(sent, 0u) << where(m) << " fusion " << fusion;
                if (fusion == 0.0) {
                    EXPECT_EQ(staging, 0u) << where(m);
                }
            }
        }
    });
}

TEST(gradients, buckets_partly_in_node_storage_are_staged_and_exact) {
    // Odd ranks' arenas too small for any bucket (their buffers go to the heap, and are
    // staged), even ranks' buffers in the arena; gradients of ordinary meshes (one bucket per
    // parameter: on the heap, staged). Exact; the groups that mix them stage.
    const auto w = world();
    xshard::node_storage storage(w, w.rank() % 2 ? 64 : 8 << 20);
    const bool everywhere = open_everywhere(storage);
    std::size_t staged = 0;
    for_each_mesh([&](const auto& m) {
        for (double fusion : {-1.0, 0.0}) {
            const auto [sent, staging] = sync_exact(m, fusion);
            if (everywhere) {
                EXPECT_EQ(sent, 0u) << where(m) << " fusion " << fusion;
            }
            staged += staging;
        }
    });
    xshard::mpi::allreduce(w, std::span(&staged, 1), xshard::reduction::max);
    if (everywhere && w.size() > 1) {
        EXPECT_GT(staged, 0u);
    }
}

TEST(gradients, fused_buckets_are_reduced_on_the_gradients_through_shared_memory) {
    // No arena open: the groups on one node reduce their buckets through shared memory all
    // the same, fused buckets unpacked, on the gradients; exact, no MPI byte, staging the
    // others' parts. Without shared memory asked for: no window (messages); exact.
    const auto w = world();
    int one_node = xshard::node_group(w).whole_communicator_shares_memory() ? 1 : 0;
    xshard::mpi::allreduce(w, std::span(&one_node, 1), xshard::reduction::min);
    std::size_t staged = 0;
    for_each_mesh([&](const auto& m) {
        for (double fusion : {-1.0, 0.0}) {
            const auto [sent, staging] = sync_exact(m, fusion);
            if (one_node) {
                EXPECT_EQ(sent, 0u) << where(m) << " fusion " << fusion;
            }
            staged += staging;
        }
        // (Buckets this small take MPI_Allreduce, which the traffic counter does not see.)
        const auto [sent, staging] = sync_exact(m, -1.0, false);
        EXPECT_EQ(staging, 0u) << where(m);
    });
    xshard::mpi::allreduce(w, std::span(&staged, 1), xshard::reduction::max);
    if (w.size() > 1) {
        EXPECT_EQ(staged > 0, one_node == 1);
    }
}

} // namespace
