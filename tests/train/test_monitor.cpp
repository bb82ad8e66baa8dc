// The loss monitor (train/monitor.hpp): lines on rank 0 only, to a stream or a file, with a
// precision, unknown totals, and a progress bar that rewrites its line.

#include <xshard/comm/collectives.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/train/monitor.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using xshard::testing::world;

using xshard::testing::expect_error;

/// Lines of `text`.
std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        lines.push_back(line);
    return lines;
}

TEST(monitor, plain_lines_on_rank_0_only) {
    const auto w = world();
    std::ostringstream out;
    {
        xshard::loss_monitor mon(w,
                                 {.steps_per_epoch = 4, .epochs = 2, .print_every = 2, .out = out});
        const double losses[] = {0.5, 0.25, 0.125, 0.0625};
        for (int e = 0; e < 2; ++e) {
            for (double l : losses)
                mon.step(l * (e + 1), 32);
            EXPECT_EQ(mon.epoch_mean_loss(), 0.234375 * (e + 1));
            mon.end_epoch();
        }
        EXPECT_EQ(mon.epoch(), 2u);
    }
    const std::string text = out.str();
    std::vector<unsigned long> sizes(std::size_t(w.size()));
    const unsigned long mine = text.size();
    xshard::mpi::allgather(w, std::span(&mine, 1), sizes);
    for (int r = 1; r < w.size(); ++r)
        EXPECT_EQ(sizes[std::size_t(r)], 0u) << "rank " << r << " printed";
    if (w.rank() != 0)
        return;
    const auto lines = lines_of(text);
    ASSERT_EQ(lines.size(), 6u) << text;
    EXPECT_EQ(text.find('\r'), std::string::npos) << "no progress bar into a string";
    const std::string rate = R"( [0-9.]+(e\+[0-9]+)? samples/s elapsed [0-9.]+ s)";
    const std::regex step2(R"(epoch 1/2 step 2/4 loss 0\.25)" + rate + R"( eta [0-9.]+ s)");
    const std::regex step4(R"(epoch 1/2 step 4/4 loss 0\.0625)" + rate + R"( eta [0-9.]+ s)");
    const std::regex done(R"(epoch 1/2 done: 4 steps, mean loss 0\.234375)" +
                          std::string(R"(, [0-9.]+(e\+[0-9]+)? samples/s, elapsed [0-9.]+ s)"));
    const std::regex last(R"(epoch 2/2 step 4/4 loss 0\.125 .* eta 0\.0 s)");
    EXPECT_TRUE(std::regex_match(lines[0], step2)) << lines[0];
    EXPECT_TRUE(std::regex_match(lines[1], step4)) << lines[1];
    EXPECT_TRUE(std::regex_match(lines[2], done)) << lines[2];
    EXPECT_TRUE(std::regex_match(lines[4], last)) << lines[4];
    EXPECT_EQ(lines[5].rfind("epoch 2/2 done: 4 steps, mean loss 0.46875", 0), 0u) << lines[5];
}

TEST(monitor, a_file_a_precision_and_unknown_totals) {
    const auto w = world();
    const xshard::mesh<"dp"> m(w, {w.size()});
    std::FILE* file = std::tmpfile();
    ASSERT_NE(file, nullptr);
    {
        xshard::loss_monitor mon(m, {.out = file, .precision = 9});
        mon.step(0.1234567891);
        mon.step(2.0 / 3.0);
    }
    std::rewind(file);
    std::string text;
    for (int c; (c = std::fgetc(file)) != EOF;)
        text += char(c);
    std::fclose(file);
    if (w.rank() != 0) {
        EXPECT_EQ(text, "");
        return;
    }
    const auto lines = lines_of(text);
    ASSERT_EQ(lines.size(), 2u) << text;
    EXPECT_TRUE(std::regex_match(
        lines[0], std::regex(R"(epoch 1 step 1 loss 0\.123456789 elapsed [0-9.]+ s)")))
        << lines[0];
    EXPECT_EQ(lines[1].rfind("epoch 1 step 2 loss 0.666666667 elapsed", 0), 0u) << lines[1];
    expect_error([&] { xshard::loss_monitor(w, {.print_every = 0}); }, "print_every is 0");
}

TEST(monitor, a_progress_bar_rewrites_its_line) {
    const auto w = world();
    std::ostringstream out;
    xshard::loss_monitor mon(
        w, {.steps_per_epoch = 4, .epochs = 1, .out = out, .progress_bar = true, .bar_width = 8});
    for (int i = 0; i < 4; ++i)
        mon.step(1.0 / (i + 1), 10);
    mon.end_epoch();
    if (w.rank() != 0) {
        EXPECT_EQ(out.str(), "");
        return;
    }
    const std::string text = out.str();
    EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 4) << text;
    EXPECT_NE(text.find("\repoch 1/1 [##......] 1/4 loss 1 "), std::string::npos) << text;
    EXPECT_NE(text.find("\repoch 1/1 [########] 4/4 loss 0.25 "), std::string::npos) << text;
    EXPECT_NE(text.find("\x1b[K\nepoch 1/1 done: 4 steps, mean loss 0.520833"), std::string::npos)
        << text;
    EXPECT_EQ(text.back(), '\n');
}

} // namespace
