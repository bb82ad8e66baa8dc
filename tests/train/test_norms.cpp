// Norms (train/norms.hpp): the global norm counts every element once whatever the layout;
// local norms are printed and dumped per rank.

#include <xshard/tensor/distribute.hpp>
#include <xshard/train/norms.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"
#include "parameters.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>

namespace {

using xshard::testing::for_each_mesh;
using xshard::testing::where;
using xshard::testing::world;

template <class M>
using dyn = xshard::testing::dyn<M>;

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
