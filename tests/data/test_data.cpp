// The data pipeline: views, the loader on meshes, readers and synthetic datasets, each
// against a serial computation every rank can make alone.

#include <xshard/comm/collectives.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/data/dataset.hpp>
#include <xshard/data/loader.hpp>
#include <xshard/data/readers.hpp>
#include <xshard/data/synthetic.hpp>
#include <xshard/data/text.hpp>
#include <xshard/data/views.hpp>
#include <xshard/tensor/gather.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <range/v3/view/take.hpp>
#include <unistd.h>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace xd = xshard::data;
using xshard::testing::where;
using xshard::testing::world;
using index_list = std::vector<xd::index_type>;

/// n examples; example i has features (i, i + 0.25, i + 0.5) and label i, so that a batch
/// row names its sample.
std::vector<xd::example<double>> numbered(std::size_t n) {
    std::vector<xd::example<double>> data(n);
    for (std::size_t i = 0; i < n; ++i)
        data[i] = {xt::xtensor<double, 1>{double(i), i + 0.25, i + 0.5}, std::int64_t(i)};
    return data;
}

/// The Fisher-Yates shuffle views.hpp documents, written out again.
index_list reference_permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch) {
    std::seed_seq seq{std::uint32_t(seed), std::uint32_t(seed >> 32), std::uint32_t(epoch),
                      std::uint32_t(epoch >> 32)};
    std::mt19937_64 engine(seq);
    index_list order(n);
    std::iota(order.begin(), order.end(), 0u);
    for (std::size_t i = n; i > 1; --i) {
        const std::uint64_t threshold = (0 - std::uint64_t(i)) % i;
        std::uint64_t x = engine();
        while (x < threshold)
            x = engine();
        std::swap(order[i - 1], order[x % i]);
    }
    return order;
}

/// Whether every rank of `comm` holds the same `values`.
template <class T>
bool same_on_all_ranks(const xshard::communicator& comm, const std::vector<T>& values) {
    std::vector<T> all(values.size() * std::size_t(comm.size()));
    xshard::mpi::allgather(comm, values, all);
    for (int r = 0; r < comm.size(); ++r)
        if (!std::equal(values.begin(), values.end(),
                        all.begin() + std::ptrdiff_t(r * values.size())))
            return false;
    return true;
}

using xshard::testing::expect_error;

// --- views ------------------------------------------------------------------------------

TEST(views, shuffle_is_the_documented_permutation_on_every_rank) {
    const auto w = world();
    for (std::size_t n : {0, 1, 2, 7, 100, 1000}) {
        const auto p = xd::permutation(n, 42, 3);
        EXPECT_EQ(p, reference_permutation(n, 42, 3)) << "n=" << n;
        auto sorted = p;
        std::sort(sorted.begin(), sorted.end());
        index_list identity(n);
        std::iota(identity.begin(), identity.end(), 0u);
        EXPECT_EQ(sorted, identity) << "not a permutation, n=" << n;
        EXPECT_TRUE(same_on_all_ranks(w, p)) << "n=" << n << " on rank " << w.rank();
    }
    EXPECT_NE(xd::permutation(100, 42, 3), xd::permutation(100, 42, 4)) << "epochs";
    EXPECT_NE(xd::permutation(100, 42, 3), xd::permutation(100, 43, 3)) << "seeds";
    EXPECT_NE(xd::permutation(100, std::uint64_t(1) << 32, 0), xd::permutation(100, 0, 0))
        << "high seed bits";

    const auto data = numbered(50);
    const auto shuffled = data | xd::shuffle(42, 3);
    static_assert(xd::dataset<decltype(shuffled)>);
    const auto p = xd::permutation(50, 42, 3);
    ASSERT_EQ(shuffled.size(), 50u);
    for (std::size_t i = 0; i < 50; ++i)
        EXPECT_EQ(&shuffled[i], &data[p[i]]) << "the view refers to the dataset's samples";
}

TEST(views, shard_deals_round_robin_and_drops_the_tail) {
    for (std::size_t n : {0, 1, 5, 10, 11, 12, 13}) {
        const auto data = numbered(n);
        for (std::size_t shards = 1; shards <= 5; ++shards) {
            std::multiset<std::int64_t> seen;
            for (std::size_t k = 0; k < shards; ++k) {
                const auto part = data | xd::take_shard(shards, k);
                static_assert(xd::dataset<decltype(part)>);
                ASSERT_EQ(part.size(), n / shards) << "n=" << n << " shard " << k << "/" << shards;
                for (std::size_t i = 0; i < part.size(); ++i) {
                    EXPECT_EQ(part[i].label, std::int64_t(i * shards + k));
                    seen.insert(part[i].label);
                }
            }
            std::multiset<std::int64_t> expected;
            for (std::size_t i = 0; i < n / shards * shards; ++i)
                expected.insert(std::int64_t(i));
            EXPECT_EQ(seen, expected) << "n=" << n << " shards=" << shards;
        }
    }
    const auto data = numbered(4);
    expect_error([&] { (void)(data | xd::take_shard(2, 2)); },
                 "shard_id 2 is not below num_shards 2");
    expect_error([&] { (void)(data | xd::take_shard(0, 0)); }, "num_shards 0");
}

TEST(views, shards_of_a_shuffle_partition_it_across_ranks) {
    const auto w = world();
    const auto data = numbered(37);
    const auto part =
        data | xd::shuffle(7, 1) | xd::take_shard(std::size_t(w.size()), std::size_t(w.rank()));
    std::vector<std::int64_t> mine;
    for (const auto& s : part)
        mine.push_back(s.label);
    const std::size_t per = 37 / std::size_t(w.size());
    ASSERT_EQ(mine.size(), per) << "rank " << w.rank();
    std::vector<std::int64_t> all(per * std::size_t(w.size()));
    xshard::mpi::allgather(w, mine, all);
    const auto p = reference_permutation(37, 7, 1);
    for (std::size_t r = 0; r < std::size_t(w.size()); ++r)
        for (std::size_t i = 0; i < per; ++i)
            EXPECT_EQ(all[r * per + i], std::int64_t(p[i * std::size_t(w.size()) + r]))
                << "rank " << r << " sample " << i << ", seen on rank " << w.rank();
}

TEST(views, batch_collates_and_drops_the_remainder) {
    const auto data = numbered(10);
    for (bool drop : {false, true}) {
        const auto batches = data | xd::batch(4, drop);
        static_assert(xd::dataset<decltype(batches)>);
        ASSERT_EQ(batches.size(), drop ? 2u : 3u);
        for (std::size_t b = 0; b < batches.size(); ++b) {
            const xd::example_batch<double> batch = batches[b];
            const std::size_t rows = b < 2 ? 4 : 2;
            ASSERT_EQ(batch.x.shape()[0], rows);
            ASSERT_EQ(batch.x.shape()[1], 3u);
            ASSERT_EQ(batch.y.size(), rows);
            for (std::size_t r = 0; r < rows; ++r) {
                const auto i = b * 4 + r;
                EXPECT_EQ(batch.y(r), std::int64_t(i));
                for (std::size_t j = 0; j < 3; ++j)
                    EXPECT_EQ(batch.x(r, j), data[i].features(j));
            }
        }
    }
    expect_error([&] { (void)(data | xd::batch(0)); }, "batch size is 0");

    auto ragged = numbered(3);
    ragged[2].features = xt::xtensor<double, 1>{1.0};
    expect_error([&] { (void)xd::collate(ragged); }, "sample 2 of the batch has 1 values");
    const auto empty = xd::collate(ranges::views::take(data, 0), 3);
    EXPECT_EQ(empty.x.shape()[0], 0u);
    EXPECT_EQ(empty.x.shape()[1], 3u);

    std::vector<xd::token_window> windows{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
    const auto token_batches = windows | xd::batch(2);
    const xt::xtensor<std::int64_t, 2> first = token_batches[0];
    EXPECT_EQ(first, (xt::xtensor<std::int64_t, 2>{{1, 2, 3}, {4, 5, 6}}));
    EXPECT_EQ(token_batches[1], (xt::xtensor<std::int64_t, 2>{{7, 8, 9}}));
}

TEST(views, the_pipeline_equals_a_serial_loop) {
    const auto data = numbered(29);
    const auto p = reference_permutation(29, 5, 2);
    for (std::size_t shards : {1, 2, 3}) {
        for (std::size_t k = 0; k < shards; ++k) {
            const auto batches =
                data | xd::shuffle(5, 2) | xd::take_shard(shards, k) | xd::batch(3, true);
            // Serial: the shard's samples are p[k], p[k + shards], ... of the first
            // 29 / shards * shards; batches of 3, the short one dropped.
            std::vector<std::int64_t> mine;
            for (std::size_t i = k; i < 29 / shards * shards; i += shards)
                mine.push_back(std::int64_t(p[i]));
            ASSERT_EQ(batches.size(), mine.size() / 3);
            for (std::size_t b = 0; b < batches.size(); ++b) {
                const xd::example_batch<double> batch = batches[b];
                for (std::size_t r = 0; r < 3; ++r) {
                    EXPECT_EQ(batch.y(r), mine[b * 3 + r]) << shards << " shards, shard " << k;
                    EXPECT_EQ(batch.x(r, 1), double(mine[b * 3 + r]) + 0.25);
                }
            }
        }
    }
}

// --- loader -----------------------------------------------------------------------------

/// The rows of the global batch of `step` a loader must give, in the one-shard order:
/// positions step*B .. of the epoch's order.
std::vector<std::int64_t> serial_batch(std::size_t n, std::size_t batch, std::size_t step,
                                       bool shuffle, std::uint64_t seed, std::uint64_t epoch) {
    index_list order(n);
    std::iota(order.begin(), order.end(), 0u);
    if (shuffle)
        order = reference_permutation(n, seed, epoch);
    std::vector<std::int64_t> rows;
    for (std::size_t i = step * batch; i < std::min(n, (step + 1) * batch); ++i)
        rows.push_back(order[i]);
    return rows;
}

/// Checks every step of two epochs of a loader of `numbered(n)` on `m` against the serial
/// batches: the same samples (as a set, and exactly their values), in the documented row
/// order; this rank's block holds the samples `sample_indices` names.
template <class Mesh>
void check_loader(const Mesh& m, std::size_t n, const xd::loader_options& o, std::size_t shards) {
    const auto data = numbered(n);
    const xd::loader load(m, data, o);
    const auto context =
        where(m) + ", batch " + std::to_string(o.batch_size) + (o.shuffle ? ", shuffled" : "") +
        (o.drop_remainder ? ", drop" : "") +
        (load.strategy() == xshard::dataset_strategy::full_batch ? ", full batch" : "");
    ASSERT_EQ(load.num_shards(), shards) << context;
    const std::size_t steps =
        o.drop_remainder ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
    ASSERT_EQ(load.steps_per_epoch(), steps) << context;
    for (std::uint64_t e = 0; e < 2; ++e) {
        std::size_t step = 0;
        for (auto&& [x, y] : load.epoch(e)) {
            const auto expected = serial_batch(n, o.batch_size, step, o.shuffle, o.seed, e);
            const auto gx = xshard::gather_all(x);
            const auto gy = xshard::gather_all(y);
            ASSERT_EQ(gy.size(), expected.size()) << context << ", step " << step;
            ASSERT_EQ(gx.shape()[1], 3u);
            // The same samples...
            EXPECT_EQ(std::multiset<std::int64_t>(gy.begin(), gy.end()),
                      std::multiset<std::int64_t>(expected.begin(), expected.end()))
                << context << ", epoch " << e << ", step " << step;
            // ... exactly their values ...
            for (std::size_t r = 0; r < gy.size(); ++r)
                for (std::size_t j = 0; j < 3; ++j)
                    ASSERT_EQ(gx(r, j), data[std::size_t(gy(r))].features(j))
                        << context << ", row " << r;
            // ... shard k's rows (positions k, k + shards, ...) in block k.
            const std::size_t rows = expected.size();
            for (std::size_t k = 0, row = 0; k < shards; ++k)
                for (std::size_t pos = k; pos < rows; pos += shards, ++row)
                    EXPECT_EQ(gy(row), expected[pos]) << context << ", shard " << k;
            const auto mine = load.sample_indices(e, step);
            ASSERT_EQ(mine.size(), y.local().size()) << context;
            for (std::size_t i = 0; i < mine.size(); ++i)
                EXPECT_EQ(y.local()(i), std::int64_t(mine[i])) << context;
            ++step;
        }
        EXPECT_EQ(step, steps) << context;
    }
}

TEST(loader, global_batches_are_those_of_one_shard_on_every_mesh) {
    const auto w = world();
    const int p = w.size();
    for (bool full : {false, true}) {
        for (bool drop : {true, false}) {
            for (bool shuffle : {true, false}) {
                // Uneven row blocks where the shards do not divide 8 (3 or 6 ranks).
                xd::loader_options o{.batch_size = 8,
                                     .seed = 11,
                                     .shuffle = shuffle,
                                     .drop_remainder = drop,
                                     .uneven_batches = 8 % p != 0};
                if (full)
                    o.strategy = xshard::dataset_strategy::full_batch;
                const std::size_t dp = full ? 1 : std::size_t(p);
                check_loader(xshard::mesh<"dp">(w, {p}), 23, o, dp);
                if (p % 2 == 0)
                    check_loader(xshard::mesh<"dp", "mp">(w, {p / 2, 2}), 23, o, full ? 1 : dp / 2);
                check_loader(xshard::mesh<"dp", "mp">(w, {1, p}), 23, o, 1);
            }
        }
    }
}

TEST(loader, full_batches_equal_the_shard_then_batch_pipeline) {
    const auto w = world();
    const xshard::mesh<"dp"> m(w, {w.size()});
    // 12 samples a batch, 24 where 12 does not split over the ranks; three full batches.
    const std::size_t batch = 12 % w.size() == 0 ? 12 : 24;
    const auto data = numbered(3 * batch + 9);
    const xd::loader load(m, data, {.batch_size = batch, .seed = 3});
    EXPECT_EQ(load.batch_layout().to_string(), "[dp, -]");
    const auto pipeline = data | xd::shuffle(3, 1) |
                          xd::take_shard(std::size_t(w.size()), std::size_t(w.rank())) |
                          xd::batch(batch / std::size_t(w.size()), true);
    auto batches = load.epoch(1);
    ASSERT_EQ(batches.size(), 3u);
    for (std::size_t s = 0; s < 3; ++s) {
        const auto b = batches[s];
        const xd::example_batch<double> expected = pipeline[s];
        EXPECT_EQ(b.x.local(), expected.x) << where(m) << ", step " << s;
        EXPECT_EQ(b.y.local(), expected.y) << where(m) << ", step " << s;
    }
}

TEST(loader, the_mesh_gives_the_mode_and_the_data_axis) {
    const auto w = world();
    const int p = w.size();
    const auto data = numbered(16);
    const std::size_t n = 8 * std::size_t(p); // two batches of 4 per shard
    const auto more = numbered(n);
    // The data axis is the mesh's second axis here.
    const auto m = xshard::mesh<"mp", "dp">(w, {1, p}).with_dataset_strategy(
        xshard::dataset_strategy::data_parallel, "dp");
    const xd::loader load(m, more, {.batch_size = 4 * std::size_t(p)});
    EXPECT_EQ(load.num_shards(), std::size_t(p));
    EXPECT_EQ(load.shard_id(), std::size_t(m.coords()[1]));
    EXPECT_EQ(load.batch_layout().to_string(), "[dp, -]");
    check_loader(m, n, {.batch_size = 4 * std::size_t(p)}, std::size_t(p));

    const auto full = m.with_dataset_strategy(xshard::dataset_strategy::full_batch);
    const xd::loader replicated(full, data, {.batch_size = 4});
    EXPECT_EQ(replicated.strategy(), xshard::dataset_strategy::full_batch);
    EXPECT_TRUE(replicated.batch_layout().is_fully_replicated());
    const auto b = replicated.epoch(0)[0];
    EXPECT_EQ(b.x.local().shape()[0], 4u) << "every rank holds the whole batch";
}

/// Checks two epochs of a loader of `numbered(23)` with per-tensor `layouts` on `m` (batches
/// of `batch`, the last one shorter) against the full batch a full_batch loader of the same
/// options reads: its rows put in the documented order (shard k's positions k, k + S, ... in
/// block k, S the blocks of x's rows), then sliced here to this rank's block of each tensor.
template <class Mesh>
void check_layouts(const Mesh& m, const std::vector<xshard::layout>& layouts, std::size_t batch) {
    const auto data = numbered(23);
    xd::loader_options o{
        .batch_size = batch, .seed = 7, .drop_remainder = false, .uneven_batches = true};
    auto full = o;
    full.strategy = xshard::dataset_strategy::full_batch;
    o.layouts = layouts;
    const xd::loader load(m, data, o), whole(m, data, full);
    const auto context = where(m) + ", x " + layouts[0].to_string() + ", y " +
                         layouts[1].to_string() + ", batch " + std::to_string(batch);
    const auto S = std::size_t(layouts[0].split_count(0, m.shape()));
    EXPECT_EQ(load.num_shards(), S) << context;
    EXPECT_EQ(load.shard_id(), std::size_t(layouts[0].block_index(0, m.shape(), m.coords())))
        << context;
    EXPECT_EQ(load.layouts(), layouts) << context;
    EXPECT_EQ(load.strategy(), xshard::dataset_strategy::unset) << context;
    for (std::uint64_t e = 0; e < 2; ++e) {
        auto got = load.epoch(e);
        auto ref = whole.epoch(e);
        ASSERT_EQ(got.size(), ref.size()) << context;
        for (std::size_t step = 0; step < got.size(); ++step) {
            const auto b = got[step];
            const auto r = ref[step];
            const auto& gx = r.x.local();
            const auto& gy = r.y.local();
            const std::size_t n = gy.size();
            xt::xtensor<double, 2> px = gx;
            xt::xtensor<std::int64_t, 1> py = gy;
            for (std::size_t row = 0; row < n; ++row) {
                const auto k = xshard::block_holding(n, S, row);
                const auto pos = k + S * (row - xshard::block_offset(n, S, k));
                xt::row(px, std::ptrdiff_t(row)) = xt::row(gx, std::ptrdiff_t(pos));
                py(row) = gy(pos);
            }
            const auto bx = xshard::block_of(layouts[0], m.shape(), std::array{n, 3ul}, m.coords());
            const auto by = xshard::block_of(layouts[1], m.shape(), std::array{n}, m.coords());
            const xt::xtensor<double, 2> ex =
                xt::view(px, xt::range(bx.offset[0], bx.offset[0] + bx.extent[0]),
                         xt::range(bx.offset[1], bx.offset[1] + bx.extent[1]));
            const xt::xtensor<std::int64_t, 1> ey =
                xt::view(py, xt::range(by.offset[0], by.offset[0] + by.extent[0]));
            const auto at =
                context + ", epoch " + std::to_string(e) + ", step " + std::to_string(step);
            EXPECT_EQ(b.x.layout(), layouts[0]) << at;
            EXPECT_EQ(b.y.layout(), layouts[1]) << at;
            EXPECT_EQ(b.x.shape(), (std::array{n, 3ul})) << at;
            EXPECT_EQ(b.x.local(), ex) << at;
            EXPECT_EQ(b.y.local(), ey) << at;
        }
    }
}

TEST(loader, per_tensor_layouts_are_blocks_of_the_full_batch) {
    const auto w = world();
    const int p = w.size();
    using dm = xshard::mesh<"dp", "mp">;
    std::vector<dm> meshes{dm(w, {p, 1}), dm(w, {1, p})};
    if (p % 2 == 0 && p > 2)
        meshes.push_back(dm(w, {p / 2, 2}));
    if (p % 4 == 0 && p > 4)
        meshes.push_back(dm(w, {2, p / 2}));
    using L = xshard::layout;
    for (const auto& m : meshes) {
        for (const auto& [x, y] : std::vector<std::pair<const char*, const char*>>{
                 {"[dp, mp]", "[dp]"},          // features split too
                 {"[dp, -]", "[-]"},            // labels whole on every rank
                 {"[(dp,mp), -]", "[(dp,mp)]"}, // rows over both axes
                 {"[(mp,dp), -]", "[dp]"},      // labels' rows split otherwise
                 {"[-, (dp,mp)]", "[mp]"}})     // no row split for x
            for (std::size_t batch : {8ul, 5ul})
                check_layouts(m, {L::parse(x), L::parse(y)}, batch);
        // MindSpore's ((1, p), (1,)) as strategies: x's features split over the mesh.
        check_layouts(m, {xshard::resolve({1, p}, m.shape()), xshard::resolve({1}, m.shape())}, 8);
    }
}

TEST(loader, bad_layouts_raise_on_every_rank) {
    const auto w = world();
    const xshard::mesh<"dp", "mp"> m(w, {w.size(), 1});
    const auto data = numbered(10);
    using L = xshard::layout;
    auto with = [&](std::vector<L> ls) {
        return [&, ls] {
            xd::loader(m, data, {.batch_size = 10, .uneven_batches = true, .layouts = ls});
        };
    };
    expect_error(with({L::parse("[dp, -]")}), "1 layouts for a batch of 2 tensors (x, y)");
    expect_error(with({L::parse("[dp]"), L::parse("[dp]")}),
                 "layout [dp] for tensor 0 of the batch, which has rank 2");
    expect_error(with({L::parse("[dp, -]"), L::parse("[pp]")}), "names an axis the mesh");
    expect_error(with({L::parse("[dp, dp]"), L::parse("[-]")}), "uses a mesh axis twice");
    expect_error(with({L::parse("[dp, -] partial(sum: mp)"), L::parse("[-]")}), "has pending sums");
}

TEST(loader, an_rvalue_dataset_is_kept) {
    const auto w = world();
    const xshard::mesh<"dp"> m(w, {w.size()});
    auto make = [&] {
        return xd::loader(m, numbered(8), {.batch_size = std::size_t(w.size())});
    };
    const auto load = make();
    const auto b = load.epoch(0)[0];
    EXPECT_EQ(xshard::gather_all(b.y).size(), std::size_t(w.size()));
}

TEST(loader, misuse_raises_on_every_rank) {
    const auto w = world();
    const int p = w.size();
    const xshard::mesh<"dp"> m(w, {p});
    const auto data = numbered(10);
    expect_error([&] { xd::loader(m, data, {.batch_size = 0}); }, "batch size is 0");
    if (p > 1)
        expect_error([&] { xd::loader(m, data, {.batch_size = std::size_t(p) + 1}); },
                     "is not a multiple of the " + std::to_string(p) + " shards of axis dp");
    expect_error([&] { xd::loader(m, numbered(0), {.batch_size = std::size_t(p)}); },
                 "the dataset is empty");
    expect_error([&] { xd::loader(m, data, {.batch_size = 16 * std::size_t(p)}); },
                 "fewer than one batch");
    expect_error([&] { xd::loader(m, data, {.batch_size = std::size_t(p), .data_axis = "mp"}); },
                 "has no data axis 'mp'");
    // Without drop_remainder a dataset smaller than a batch is one short step.
    const xd::loader small(m, data, {.batch_size = 16 * std::size_t(p), .drop_remainder = false});
    EXPECT_EQ(small.steps_per_epoch(), 1u);
    expect_error([&] { (void)small.sample_indices(0, 1); }, "step 1 of an epoch of 1");
}

TEST(loader, uneven_batch_blocks_on_request) {
    const auto w = world();
    const int p = w.size();
    // A global batch of p + 1 rows: shard 0 reads two, the others one (at p = 1: even).
    xd::loader_options o{.batch_size = std::size_t(p) + 1, .seed = 5, .uneven_batches = true};
    check_loader(xshard::mesh<"dp">(w, {p}), 23, o, std::size_t(p));
    o.drop_remainder = false;
    check_loader(xshard::mesh<"dp">(w, {p}), 23, o, std::size_t(p));
    const xd::loader load(xshard::mesh<"dp">(w, {p}), numbered(23), o);
    EXPECT_EQ(load.local_batch_size(), xshard::block_extent(std::size_t(p) + 1, std::size_t(p),
                                                            std::size_t(w.rank())))
        << "rank " << w.rank();
}

TEST(loader, datasets_of_different_sizes_raise_on_every_rank) {
    const auto w = world();
    const int p = w.size();
    const xshard::mesh<"dp"> m(w, {p});
    // The last rank holds one sample more (at one rank: nothing differs).
    const auto data = numbered(10 + (p > 1 && w.rank() == p - 1 ? 1 : 0));
    if (p > 1)
        expect_error([&] { xd::loader(m, data, {.batch_size = std::size_t(p)}); },
                     "xshard: loader: the ranks hold datasets of different sizes (10 to 11 "
                     "samples)");
    else
        EXPECT_EQ(xd::loader(m, data, {.batch_size = 1}).steps_per_epoch(), 10u);
    // The last rank holds nothing: it must not throw "empty" alone.
    const auto none_on_last = numbered(p > 1 && w.rank() == p - 1 ? 0 : 10);
    if (p > 1)
        expect_error([&] { xd::loader(m, none_on_last, {.batch_size = std::size_t(p)}); },
                     "the ranks hold datasets of different sizes (0 to 10 samples)");
}

TEST(loader, token_windows_become_a_rank_2_tensor) {
    const auto w = world();
    const int p = w.size();
    std::string text;
    for (int i = 0; i < 300; ++i)
        text += char('a' + i * 7 % 26);
    const xd::text_corpus corpus(text, 8);
    const xshard::mesh<"dp"> m(w, {p});
    const xd::loader load(m, corpus, {.batch_size = 4 * std::size_t(p), .seed = 9});
    std::size_t step = 0;
    for (auto&& batch : load.epoch(0)) {
        static_assert(
            std::is_same_v<
                std::remove_cvref_t<decltype(batch)>,
                xshard::dtensor<std::int64_t, xshard::mesh<"dp">, xshard::dynamic_layout(2)>>);
        const auto g = xshard::gather_all(batch);
        ASSERT_EQ(g.shape()[1], 9u);
        const auto expected = serial_batch(corpus.size(), 4 * std::size_t(p), step, true, 9, 0);
        std::multiset<std::string> got, want;
        for (std::size_t r = 0; r < g.shape()[0]; ++r) {
            std::string row;
            for (std::size_t j = 0; j < 9; ++j)
                row += char(g(r, j));
            got.insert(row);
        }
        for (auto i : expected)
            want.insert(text.substr(std::size_t(i) * 8, 9));
        EXPECT_EQ(got, want) << where(m) << ", step " << step;
        ++step;
    }
    EXPECT_EQ(step, corpus.size() / (4 * std::size_t(p)));
}

/// One SGD step of softmax regression (weights W: classes x features, bias b) on `x`, `y`,
/// returning the summed loss of the rows; `grad` receives the summed gradients (W then b).
double softmax_regression_sums(const xt::xtensor<float, 2>& x,
                               const xt::xtensor<std::int64_t, 1>& y, const std::vector<double>& wb,
                               std::size_t classes, std::vector<double>& grad) {
    const std::size_t f = x.shape()[1];
    double loss = 0;
    std::vector<double> z(classes);
    for (std::size_t r = 0; r < x.shape()[0]; ++r) {
        for (std::size_t c = 0; c < classes; ++c) {
            z[c] = wb[classes * f + c];
            for (std::size_t j = 0; j < f; ++j)
                z[c] += wb[c * f + j] * double(x(r, j));
        }
        const double top = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (auto& v : z)
            sum += (v = std::exp(v - top));
        loss += std::log(sum) - std::log(z[std::size_t(y(r))]);
        for (std::size_t c = 0; c < classes; ++c) {
            const double g = z[c] / sum - (std::int64_t(c) == y(r) ? 1.0 : 0.0);
            for (std::size_t j = 0; j < f; ++j)
                grad[c * f + j] += g * double(x(r, j));
            grad[classes * f + c] += g;
        }
    }
    return loss;
}

/// Losses of `epochs` epochs of softmax regression, the data read by `batches(epoch)` and
/// the sums over the global batch completed by `sum` (an all-reduce, or nothing).
template <class Batches, class Sum>
std::vector<double> train_softmax(std::size_t features, std::size_t classes, std::size_t epochs,
                                  Batches batches, Sum sum) {
    std::vector<double> wb(classes * features + classes, 0.0), losses;
    for (std::size_t e = 0; e < epochs; ++e) {
        for (auto&& [x, y, rows] : batches(e)) {
            std::vector<double> grad(wb.size(), 0.0);
            grad.push_back(softmax_regression_sums(x, y, wb, classes, grad));
            sum(grad);
            losses.push_back(grad.back() / double(rows));
            for (std::size_t i = 0; i < wb.size(); ++i)
                wb[i] -= 0.5 * grad[i] / double(rows);
        }
    }
    return losses;
}

TEST(loader, training_gives_the_same_losses_on_any_number_of_ranks) {
    const auto w = world();
    const int p = w.size();
    const auto data =
        xd::synthetic_classification({.samples = 200, .features = 6, .classes = 3, .seed = 4});
    struct local_batch {
        xt::xtensor<float, 2> x;
        xt::xtensor<std::int64_t, 1> y;
        std::size_t rows;
    };
    // Serial: one process, the whole batch.
    const auto serial = train_softmax(
        6, 3, 3,
        [&](std::size_t e) {
            std::vector<local_batch> out;
            for (const xd::example_batch<float> b : data | xd::shuffle(21, e) | xd::batch(20, true))
                out.push_back({b.x, b.y, 20});
            return out;
        },
        [](std::vector<double>&) {});

    auto run = [&](const auto& m, xshard::dataset_strategy mode, const xshard::communicator& dp) {
        // Uneven row blocks where the data axis does not divide 20 (3 or 6 ranks).
        const xd::loader load(
            m, data, {.batch_size = 20, .seed = 21, .uneven_batches = true, .strategy = mode});
        return train_softmax(
            6, 3, 3,
            [&](std::size_t e) {
                std::vector<local_batch> out;
                for (auto&& [x, y] : load.epoch(e))
                    out.push_back({x.local(), y.local(), x.shape()[0]});
                return out;
            },
            [&](std::vector<double>& sums) {
                xshard::mpi::allreduce(dp, std::span(sums), xshard::reduction::sum);
            });
    };
    auto compare = [&](const std::vector<double>& losses, const std::string& context, bool exact) {
        ASSERT_EQ(losses.size(), serial.size()) << context;
        for (std::size_t i = 0; i < losses.size(); ++i) {
            if (exact)
                EXPECT_EQ(losses[i], serial[i]) << context << ", step " << i;
            else
                EXPECT_NEAR(losses[i], serial[i], 1e-12 * std::max(1.0, std::abs(serial[i])))
                    << context << ", step " << i;
        }
        EXPECT_LT(losses.back(), 0.9 * losses.front()) << context << ": the model learns";
    };
    {
        const xshard::mesh<"dp"> m(w, {p});
        compare(run(m, xshard::dataset_strategy::data_parallel, m.sub<"dp">()), where(m), false);
    }
    if (p % 2 == 0 && 20 % (p / 2) == 0) {
        const xshard::mesh<"dp", "mp"> m(w, {p / 2, 2});
        compare(run(m, xshard::dataset_strategy::data_parallel, m.sub<"dp">()), where(m), false);
    }
    // Full batch: every rank computes the serial step itself, in the same order.
    const xshard::mesh<"dp"> m(w, {p});
    compare(run(m, xshard::dataset_strategy::full_batch, xshard::communicator::self()),
            where(m) + ", full batch", true);
}

// --- readers ----------------------------------------------------------------------------

/// A scratch directory of this rank, removed at the end of the test.
struct scratch_dir {
    std::filesystem::path path;
    scratch_dir() {
        path = std::filesystem::temp_directory_path() /
               ("xshard_test_data_" + std::to_string(::getpid()) + "_" +
                std::to_string(world().rank()));
        std::filesystem::create_directories(path);
    }
    ~scratch_dir() { std::filesystem::remove_all(path); }
    std::filesystem::path write(const std::string& name,
                                const std::vector<unsigned char>& bytes) const {
        std::ofstream(path / name, std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        return path / name;
    }
};

void put_u32(std::vector<unsigned char>& b, std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
        b.push_back(static_cast<unsigned char>(v >> shift));
}

std::vector<unsigned char> idx_images(std::uint32_t magic, std::uint32_t count, std::uint32_t rows,
                                      std::uint32_t cols, std::size_t pixels) {
    std::vector<unsigned char> b;
    put_u32(b, magic);
    put_u32(b, count);
    put_u32(b, rows);
    put_u32(b, cols);
    for (std::size_t i = 0; i < pixels; ++i)
        b.push_back(static_cast<unsigned char>(i * 37 % 256));
    return b;
}

std::vector<unsigned char> idx_labels(std::uint32_t magic, std::uint32_t count,
                                      std::size_t labels) {
    std::vector<unsigned char> b;
    put_u32(b, magic);
    put_u32(b, count);
    for (std::size_t i = 0; i < labels; ++i)
        b.push_back(static_cast<unsigned char>(i % 10));
    return b;
}

TEST(readers, mnist_idx_files) {
    const scratch_dir dir;
    const auto images = dir.write("images", idx_images(2051, 5, 3, 4, 60));
    const auto labels = dir.write("labels", idx_labels(2049, 5, 5));
    const auto data = xd::read_mnist(images, labels);
    ASSERT_EQ(data.size(), 5u);
    for (std::size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(data[i].label, std::int64_t(i % 10));
        ASSERT_EQ(data[i].features.size(), 12u);
        for (std::size_t j = 0; j < 12; ++j)
            EXPECT_EQ(data[i].features(j), float((i * 12 + j) * 37 % 256) / 255.0f);
    }
    static_assert(std::is_same_v<decltype(xd::read_mnist<double>(images, labels))::value_type,
                                 xd::example<double>>);

    auto fails = [&](const std::vector<unsigned char>& img, const std::vector<unsigned char>& lab,
                     const std::string& text) {
        const auto i = dir.write("bad_images", img);
        const auto l = dir.write("bad_labels", lab);
        expect_error([&] { xd::read_mnist(i, l); }, text);
    };
    fails(idx_images(2049, 5, 3, 4, 60), idx_labels(2049, 5, 5),
          "is not an IDX file of images: magic number 2049, expected 2051");
    fails(idx_images(2051, 5, 3, 4, 60), idx_labels(2051, 5, 5),
          "is not an IDX file of labels: magic number 2051, expected 2049");
    fails(idx_images(2051, 5, 3, 4, 59), idx_labels(2049, 5, 5),
          "is truncated: its header announces 5 images (60 bytes of data) but it holds 59");
    fails(idx_images(2051, 5, 3, 4, 61), idx_labels(2049, 5, 5), "is too long");
    fails(idx_images(2051, 5, 3, 4, 60), idx_labels(2049, 5, 4),
          "is truncated: its header announces 5 labels");
    fails({0x00, 0x00, 0x08}, idx_labels(2049, 5, 5),
          "is truncated: 3 bytes, shorter than the 16-byte header");
    fails(idx_images(2051, 5, 3, 4, 60), idx_labels(2049, 6, 6), "has 5 images but");
    fails({0x1f, 0x8b, 0x08, 0x00}, idx_labels(2049, 5, 5), "gzip-compressed");
    fails(idx_images(2051, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0), idx_labels(2049, 5, 5),
          "over 2^64 bytes");
    expect_error([&] { xd::read_mnist(dir.path / "missing", labels); }, "cannot open");
}

/// A pipeline's per-stage reading: ranks read the images only, the labels only, both or
/// neither (rank 0 the images, the last rank the labels); each gets the full read's count,
/// its part of each example equal to the full read's, and empty examples where it read
/// nothing. Image and label files of different counts, and no rank reading, raise on every
/// rank. Each rank reads its own copy of the files.
TEST(readers, mnist_parts_per_stage_agree_on_the_count) {
    const auto w = world();
    const int r = w.rank(), p = w.size();
    const scratch_dir dir;
    const auto images = dir.write("images", idx_images(2051, 5, 3, 4, 60));
    const auto labels = dir.write("labels", idx_labels(2049, 5, 5));
    const auto full = xd::read_mnist<double>(images, labels);
    const xd::dataset_parts parts{.images = r % 3 == 0, .labels = r == p - 1 || r % 3 == 1};
    const auto part = xd::read_mnist<double>(w, images, labels, parts);
    ASSERT_EQ(part.size(), full.size());
    for (std::size_t i = 0; i < full.size(); ++i) {
        EXPECT_EQ(part[i].label, parts.labels ? full[i].label : 0) << i;
        if (parts.images)
            EXPECT_EQ(part[i].features, full[i].features) << i;
        else
            EXPECT_EQ(part[i].features.size(), 0u) << i;
    }
    // The last rank's label file has one label fewer (when it reads labels, others images).
    const auto fewer = dir.write("fewer", idx_labels(2049, r == p - 1 ? 4 : 5, r == p - 1 ? 4 : 5));
    expect_error(
        [&] {
            (void)xd::read_mnist<double>(w, images, fewer,
                                         {.images = r != p - 1 || p == 1, .labels = r == p - 1});
        },
        p == 1 ? "has 5 images but" : "the image and label files must hold as many");
    expect_error(
        [&] { (void)xd::read_mnist<double>(w, images, labels, {.images = false, .labels = false}); },
        "no rank reads");
}

std::vector<unsigned char> cifar_records(std::size_t n, std::size_t first) {
    std::vector<unsigned char> b;
    for (std::size_t r = 0; r < n; ++r) {
        b.push_back(static_cast<unsigned char>((first + r) % 10));
        for (std::size_t j = 0; j < 3072; ++j)
            b.push_back(static_cast<unsigned char>((first + r + j * 3) % 256));
    }
    return b;
}

TEST(readers, ranks_that_read_different_files_raise_on_every_rank) {
    const auto w = world();
    const int p = w.size();
    const bool last = w.rank() == p - 1;
    const scratch_dir dir; // one per rank: each rank reads its own copy
    const auto labels = dir.write("labels", idx_labels(2049, 5, 5));
    const auto good = dir.write("images", idx_images(2051, 5, 3, 4, 60));
    EXPECT_EQ(xd::read_mnist(w, good, labels).size(), 5u);
    // The last rank's copy has one image (and label) more.
    const auto more =
        dir.write("more_images", idx_images(2051, last ? 6 : 5, 3, 4, last ? 72 : 60));
    const auto more_labels = dir.write("more_labels", idx_labels(2049, last ? 6 : 5, last ? 6 : 5));
    if (p > 1)
        expect_error([&] { xd::read_mnist(w, more, more_labels); },
                     "xshard: read_mnist: the ranks hold datasets of different sizes (5 to 6 "
                     "samples)");
    // The last rank's copy is damaged: it raises its own error, the others name it.
    const auto damaged = dir.write("damaged", idx_images(2051, 5, 3, 4, last ? 59 : 60));
    expect_error([&] { xd::read_mnist(w, damaged, labels); },
                 last ? std::string("is truncated")
                      : "rank " + std::to_string(p - 1) + " failed: xshard: read_mnist: ");
    // CIFAR-10: a file of another record count on the last rank.
    const auto batch = dir.write("batch.bin", cifar_records(last ? 3 : 2, 0));
    if (p > 1)
        expect_error([&] { xd::read_cifar10(w, batch); },
                     "xshard: read_cifar10: the ranks hold datasets of different sizes (2 to 3 "
                     "samples)");
    else
        EXPECT_EQ(xd::read_cifar10(w, batch).size(), 3u);
}


TEST(readers, cifar10_binary_files) {
    const scratch_dir dir;
    const auto one = dir.write("data_batch_1.bin", cifar_records(3, 0));
    const auto two = dir.write("data_batch_2.bin", cifar_records(2, 3));
    const auto data = xd::read_cifar10({one, two});
    ASSERT_EQ(data.size(), 5u);
    for (std::size_t r = 0; r < 5; ++r) {
        EXPECT_EQ(data[r].label, std::int64_t(r % 10));
        ASSERT_EQ(data[r].features.size(), 3072u);
        // Channel-major: red plane (32 x 32), then green, then blue, as stored.
        for (std::size_t j : {0, 1, 1023, 1024, 2047, 2048, 3071})
            EXPECT_EQ(data[r].features(j), float((r + j * 3) % 256) / 255.0f) << "record " << r;
    }
    EXPECT_EQ(xd::read_cifar10(one).size(), 3u);

    auto bad = cifar_records(2, 0);
    bad.pop_back();
    expect_error(
        [&] { xd::read_cifar10(dir.write("short.bin", bad)); },
        "is truncated: 6145 bytes are not a whole number of 3073-byte records (1 and 3072");
    auto label = cifar_records(3, 0);
    label[2 * 3073] = 10;
    expect_error([&] { xd::read_cifar10(dir.write("label.bin", label)); },
                 "record 2 has label 10; CIFAR-10 labels are 0..9");
    expect_error([&] { xd::read_cifar10(dir.write("empty.bin", {})); }, "is empty");
    expect_error([&] { xd::read_cifar10(dir.path / "missing.bin"); }, "cannot open");
}

// --- synthetic datasets -----------------------------------------------------------------

TEST(synthetic, classification_is_deterministic_and_the_same_on_every_rank) {
    const xd::synthetic_classification_options o{
        .samples = 300, .features = 5, .classes = 3, .seed = 17};
    const auto a = xd::synthetic_classification(o);
    const auto b = xd::synthetic_classification(o);
    auto longer = o;
    longer.samples = 400;
    const auto c = xd::synthetic_classification(longer);
    auto other = o;
    other.seed = 18;
    const auto d = xd::synthetic_classification(other);
    ASSERT_EQ(a.size(), 300u);
    std::vector<float> flat;
    std::set<std::int64_t> labels;
    bool differs = false;
    for (std::size_t i = 0; i < 300; ++i) {
        ASSERT_EQ(a[i].features.size(), 5u);
        EXPECT_EQ(a[i].features, b[i].features);
        EXPECT_EQ(a[i].label, b[i].label);
        EXPECT_EQ(a[i].features, c[i].features) << "sample " << i << " depends on .samples";
        EXPECT_EQ(a[i].label, c[i].label);
        differs |= a[i].features != d[i].features;
        labels.insert(a[i].label);
        flat.insert(flat.end(), a[i].features.begin(), a[i].features.end());
        flat.push_back(float(a[i].label));
    }
    EXPECT_TRUE(differs) << "the seed changes the data";
    EXPECT_EQ(labels, (std::set<std::int64_t>{0, 1, 2}));
    EXPECT_TRUE(same_on_all_ranks(world(), flat));
    expect_error([] { xd::synthetic_classification({.features = 0}); }, "must be positive");
}

/// Accuracy on held-out samples of a model trained by minibatch SGD on the serial pipeline:
/// one hidden ReLU layer of `hidden` units, or softmax regression when hidden is 0.
double train_and_score(const std::vector<xd::example<float>>& train,
                       const std::vector<xd::example<float>>& test, std::size_t features,
                       std::size_t classes, std::size_t hidden, std::size_t epochs) {
    const bool linear = hidden == 0;
    const std::size_t h = linear ? features : hidden;
    auto engine = xd::seeded_engine(99, 0);
    std::vector<double> w1(h * features), b1(h), w2(classes * h), b2(classes);
    if (!linear)
        for (auto& v : w1)
            v = xd::standard_normal(engine) * std::sqrt(2.0 / double(features));
    std::vector<double> a(h), z(classes), dh(h);
    auto forward = [&](const double* x) {
        for (std::size_t k = 0; k < h; ++k) {
            double s = b1[k];
            for (std::size_t j = 0; j < features && !linear; ++j)
                s += w1[k * features + j] * x[j];
            a[k] = linear ? x[k] : std::max(s, 0.0);
        }
        double top = -1e300, sum = 0;
        for (std::size_t c = 0; c < classes; ++c) {
            z[c] = b2[c];
            for (std::size_t k = 0; k < h; ++k)
                z[c] += w2[c * h + k] * a[k];
            top = std::max(top, z[c]);
        }
        for (auto& v : z)
            sum += (v = std::exp(v - top));
        for (auto& v : z)
            v /= sum;
    };
    std::vector<double> x(features);
    for (std::size_t e = 0; e < epochs; ++e) {
        for (const xd::example_batch<float> batch :
             train | xd::shuffle(5, e) | xd::batch(32, true)) {
            std::vector<double> g1(w1.size()), gb1(h), g2(w2.size()), gb2(classes);
            for (std::size_t r = 0; r < 32; ++r) {
                for (std::size_t j = 0; j < features; ++j)
                    x[j] = batch.x(r, j);
                forward(x.data());
                z[std::size_t(batch.y(r))] -= 1;
                for (std::size_t c = 0; c < classes; ++c) {
                    gb2[c] += z[c];
                    for (std::size_t k = 0; k < h; ++k)
                        g2[c * h + k] += z[c] * a[k];
                }
                for (std::size_t k = 0; k < h && !linear; ++k) {
                    double g = 0;
                    for (std::size_t c = 0; c < classes; ++c)
                        g += z[c] * w2[c * h + k];
                    dh[k] = a[k] > 0 ? g : 0;
                    gb1[k] += dh[k];
                    for (std::size_t j = 0; j < features; ++j)
                        g1[k * features + j] += dh[k] * x[j];
                }
            }
            const double lr = 0.1 / 32;
            for (std::size_t i = 0; i < w1.size(); ++i)
                w1[i] -= lr * g1[i];
            for (std::size_t i = 0; i < h; ++i)
                b1[i] -= lr * gb1[i];
            for (std::size_t i = 0; i < w2.size(); ++i)
                w2[i] -= lr * g2[i];
            for (std::size_t i = 0; i < classes; ++i)
                b2[i] -= lr * gb2[i];
        }
    }
    std::size_t right = 0;
    for (const auto& s : test) {
        for (std::size_t j = 0; j < features; ++j)
            x[j] = s.features(j);
        forward(x.data());
        right +=
            std::size_t(std::max_element(z.begin(), z.end()) - z.begin()) == std::size_t(s.label);
    }
    return double(right) / double(test.size());
}

TEST(synthetic, classification_is_learnable_by_an_mlp_but_not_linearly) {
    if (world().rank() != 0)
        return; // serial work: one rank is enough
    const auto all =
        xd::synthetic_classification({.samples = 3000, .features = 16, .classes = 4, .seed = 1});
    const std::vector<xd::example<float>> train(all.begin(), all.begin() + 2000);
    const std::vector<xd::example<float>> test(all.begin() + 2000, all.end());
    const double mlp = train_and_score(train, test, 16, 4, 64, 15);
    const double linear = train_and_score(train, test, 16, 4, 0, 15);
    EXPECT_GE(mlp, 0.95) << "MLP held-out accuracy";
    EXPECT_LT(linear, 0.85) << "softmax regression held-out accuracy";
    std::printf("[ synthetic ] held-out accuracy: MLP %.3f, linear %.3f\n", mlp, linear);
}

TEST(synthetic, text_corpus_windows) {
    const std::string text = "hello, distributed world\xe9\xff";
    const xd::text_corpus corpus(text, 5);
    static_assert(xd::dataset<xd::text_corpus>);
    EXPECT_EQ(xd::text_corpus::vocab_size, 256u);
    ASSERT_EQ(corpus.size(), (text.size() - 1) / 5);
    for (std::size_t i = 0; i < corpus.size(); ++i) {
        const xd::token_window window = corpus[i];
        ASSERT_EQ(window.size(), 6u);
        for (std::size_t j = 0; j < 6; ++j)
            EXPECT_EQ(window(j), std::int64_t(static_cast<unsigned char>(text[i * 5 + j])))
                << "window " << i << ", token " << j;
    }
    EXPECT_EQ(corpus[corpus.size() - 1](5), 0xff) << "bytes are unsigned tokens";

    const scratch_dir dir;
    const auto path = dir.write("corpus.txt", std::vector<unsigned char>(text.begin(), text.end()));
    const auto from_file = xd::text_corpus::from_file(path, 5);
    ASSERT_EQ(from_file.size(), corpus.size());
    for (std::size_t i = 0; i < corpus.size(); ++i)
        EXPECT_EQ(from_file[i], corpus[i]);
    const auto shuffled = corpus | xd::shuffle(1, 0);
    const auto p = reference_permutation(corpus.size(), 1, 0);
    EXPECT_EQ(shuffled[0], corpus[p[0]]);

    expect_error([] { xd::text_corpus("abc", 0); }, "seq_len is 0");
    expect_error([] { xd::text_corpus("abc", 3); }, "fewer than one window of seq_len + 1 = 4");
    expect_error([&] { xd::text_corpus::from_file(dir.path / "missing.txt", 4); }, "cannot open");
}

} // namespace
