// Strategy files and distributed checkpoints: saved in one set of layouts, loaded into
// others on every mesh of the world, and damaged in every way the loader must catch. Every
// value is checked against `expected_value` (model.hpp), which any rank computes alone.

#include <xshard/comm/subarray.hpp>
#include <xshard/io/checkpoint.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/format.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/node_io.hpp>
#include <xshard/io/offline.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "model.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace xshard::testing;
using xshard::checkpoint_format;
using xshard::io_error;

std::string scratch() {
    return shared_directory(world(), XSHARD_TEST_DATA_DIR "/scratch");
}

/// Runs `f` on rank 0 (file surgery), then waits for it everywhere.
void on_rank0(const std::function<void()>& f) {
    if (world().rank() == 0)
        f();
    xshard::mpi::barrier(world());
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Rewrites the JSON header of safetensors file `from` with `edit`, keeping the data, into `to`.
void edit_header(const std::string& from, const std::string& to,
                 const std::function<void(nlohmann::json&)>& edit) {
    const auto bytes = slurp(from);
    std::uint64_t length = 0;
    for (int i = 7; i >= 0; --i)
        length = length << 8 | std::uint8_t(bytes[std::size_t(i)]);
    auto json = nlohmann::json::parse(bytes.substr(8, std::size_t(length)));
    edit(json);
    const auto text = json.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i)
        out[std::size_t(i)] = char((text.size() >> (8 * i)) & 0xff);
    spit(to, out + text + bytes.substr(8 + std::size_t(length)));
}

/// Expects `f` to throw io_error whose message contains `what`, on every rank.
template <class F>
void expect_io_error(F&& f, const std::string& what, const std::string& context) {
    try {
        f();
        ADD_FAILURE() << context << ": no error, expected one about \"" << what << "\"";
    } catch (const io_error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
            << context << ": \"" << e.what() << "\" does not mention \"" << what << "\"";
    }
}

// --- strategy files ---------------------------------------------------------------------

TEST(strategy_file, round_trips_trainable_parameters_unless_asked_for_all) {
    for_each_world_mesh([&](const ckpt_mesh& m) {
        net n(m, saved_layouts);
        const auto dir = scratch();
        xshard::save_strategy_file(dir + "/trainable.json", n);
        xshard::save_strategy_file(dir + "/all.json", n, true, 3);
        const auto t = xshard::load_strategy_file(dir + "/trainable.json");
        const auto a = xshard::load_strategy_file(dir + "/all.json");
        EXPECT_EQ(t.mesh, m.shape()) << where(m);
        EXPECT_EQ(t.pipeline_stages, 1);
        EXPECT_EQ(a.pipeline_stages, 3);
        EXPECT_EQ(t.parameters.size(), 5u) << "the non-trainable 'counts' is left out";
        EXPECT_EQ(t.find("counts"), nullptr);
        ASSERT_EQ(a.parameters.size(), 6u);
        const auto* w2 = a.find("w2");
        ASSERT_NE(w2, nullptr);
        EXPECT_EQ(w2->dtype, "F32");
        EXPECT_EQ(w2->shape, (std::vector<std::size_t>{7, 5}));
        EXPECT_EQ(w2->lay, xshard::layout("[mp, -]"));
        EXPECT_FALSE(a.find("counts")->trainable);
        EXPECT_EQ(a.find("counts")->dtype, "I32");
        EXPECT_EQ(a.find("h")->dtype, "BF16");
        EXPECT_EQ(a.layouts(), xshard::layouts_of(n));
        EXPECT_NO_THROW(a.check_mesh(m.shape()));
    });
}

TEST(strategy_file, gives_run_time_layouts_that_redistribution_uses) {
    for_each_world_mesh([&](const ckpt_mesh& m) {
        net saved(m, saved_layouts), now(m, other_layouts);
        saved.fill_all();
        const auto dir = scratch();
        xshard::save_strategy_file(dir + "/s.json", saved);
        const auto layouts = xshard::load_strategy_file(dir + "/s.json").layouts();
        // Bring `now`'s tensors into the saved strategy's layouts.
        auto w1 = xshard::redistribute<xshard::dynamic_layout(2)>(saved.w1, layouts.at("w1"));
        auto e = xshard::redistribute<xshard::dynamic_layout(3)>(
            xshard::redistribute<xshard::dynamic_layout(3)>(saved.e, other_layouts.at("e")),
            layouts.at("e"));
        EXPECT_EQ(w1.layout(), saved.w1.layout());
        EXPECT_EQ(e.layout(), saved.e.layout());
        EXPECT_EQ(mismatches(e, "e"), 0u) << where(m);
    });
}

TEST(strategy_file, reports_a_mesh_that_does_not_fit_with_both_meshes) {
    const auto w = world();
    const ckpt_mesh m(w, {w.size(), 1});
    net n(m, saved_layouts);
    const auto dir = scratch();
    xshard::save_strategy_file(dir + "/s.json", n);
    const auto f = xshard::load_strategy_file(dir + "/s.json");
    const auto other = xshard::mesh_shape::parse("tp=" + std::to_string(w.size()));
    const auto both = "the strategy file's mesh(dp=" + std::to_string(w.size()) +
                      ", mp=1) does not fit this mesh(tp=" + std::to_string(w.size()) + ")";
    expect_io_error([&] { f.check_mesh(other); }, both, "check_mesh");
}

TEST(strategy_file, rejects_malformed_files) {
    const auto dir = scratch();
    const std::string good = R"({"format": "xshard-strategy", "version": 1,
        "mesh": {"axes": ["dp"], "sizes": [2]}, "pipeline_stages": 1,
        "parameters": [{"name": "w", "shape": [4, 2], "dtype": "F64", "layout": "[dp, -]"}]})";
    const std::vector<std::pair<std::string, std::string>> cases{
        {"{", "malformed strategy file"},
        {R"({"format": "other", "version": 1})", "not an xshard strategy file"},
        {std::string(good).replace(good.find("\"version\": 1"), 12, "\"version\": 7"), "version 7"},
        {std::string(good).replace(good.find("F64"), 3, "F65"), "unknown dtype 'F65'"},
        {std::string(good).replace(good.find("[dp, -]"), 7, "[dp]"), "layout of another rank"},
        {std::string(good).replace(good.find("[dp, -]"), 7, "[tp, -]"), "names an axis"},
        // Integers only, in range; no silent truncation or rounding.
        {std::string(good).replace(good.find("[2]}"), 3, "[4294967297]"), "a mesh size"},
        {std::string(good).replace(good.find("[4, 2]"), 6, "[4, 2.7]"), "not a count"},
        {std::string(good).replace(good.find("[4, 2]"), 6, "[4, -2]"), "not a count"},
        {std::string(good).replace(good.find("[\"dp\"]"), 6, "\"dp\""), "lists of at most"},
        {std::string(good).replace(good.find("\"pipeline_stages\": 1"), 20,
                                   "\"pipeline_stages\": -3"),
         "pipeline_stages"},
        {std::string(good).replace(good.find("\"version\": 1"), 12, "\"version\": 1.0"),
         "version 1.0"},
        {R"({"format": "xshard-strategy", "version": 1, "parameters": [],
            "mesh": {"axes": ["dp", "mp"], "sizes": [65536, 65536]}})",
         "a mesh of 4294967296 ranks"},
        {std::string(good).replace(
             good.find("{\"name\""), 0,
             R"({"name": "w", "shape": [1], "dtype": "F64", "layout": "[-]"},)"),
         "parameter 'w' appears twice"},
        {std::string(good).replace(good.find("\"w\""), 3, "\"__metadata__\""), "reserved"},
        {std::string(good).replace(good.find("F64"), 3, "F64\\u001b[2J"),
         "unknown dtype 'F64\\x1b[2J'"},
        {std::string(20000, '[') + std::string(20000, ']'), "nested deeper than 32"},
        // A pipeline's parameter: its stage a count, its own mesh one its layout fits.
        {std::string(good).replace(good.find("\"layout\""), 0, "\"stage\": -1, "), "stage"},
        {std::string(good).replace(good.find("\"layout\""), 0,
                                   R"("mesh": {"axes": ["tp"], "sizes": [2]}, )"),
         "names an axis"},
        {std::string(good).replace(good.find("\"layout\""), 0, R"("mesh": [2], )"),
         "a mesh is not an object"},
    };
    EXPECT_NO_THROW(xshard::strategy_file::from_json(good));
    // A pipeline's stage and mesh of its own round-trip.
    const auto piped = xshard::strategy_file::from_json(std::string(good).replace(
        good.find("\"layout\""), 0, R"("stage": 1, "mesh": {"axes": ["dp"], "sizes": [4]}, )"));
    ASSERT_EQ(piped.parameters.size(), 1u);
    EXPECT_EQ(piped.parameters[0].stage, 1);
    ASSERT_TRUE(piped.parameters[0].mesh);
    EXPECT_EQ(piped.mesh_of(piped.parameters[0]).to_string(), "dp=4");
    const auto again = xshard::strategy_file::from_json(piped.to_json());
    EXPECT_EQ(again.parameters[0].stage, 1);
    EXPECT_EQ(again.mesh_of(again.parameters[0]).to_string(), "dp=4");
    EXPECT_EQ(again.mesh.to_string(), "dp=2");
    for (const auto& [text, what] : cases)
        expect_io_error([&] { xshard::strategy_file::from_json(text); }, what, text);
    expect_io_error([&] { xshard::load_strategy_file(dir + "/missing.json"); }, "cannot open",
                    "missing file");
}

TEST(strategy_file, checkpoint_json_ranks_must_equal_the_mesh_size) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const auto path = scratch() + "/ckpt";
    net n(m, saved_layouts);
    xshard::save_checkpoint(path, n, {.format = checkpoint_format::per_rank});
    on_rank0([&] {
        auto j = nlohmann::json::parse(slurp(path + "/checkpoint.json"));
        j["ranks"] = w.size() + 1;
        spit(path + "/checkpoint.json", j.dump());
    });
    expect_io_error([&] { xshard::checkpoint_reader r(path); }, "'ranks' is", "ranks");
    xshard::mpi::barrier(w);
    on_rank0([&] {
        auto j = nlohmann::json::parse(slurp(path + "/checkpoint.json"));
        j["ranks"] = w.size();
        j["step"] = 2.5;
        spit(path + "/checkpoint.json", j.dump());
    });
    expect_io_error([&] { xshard::checkpoint_reader r(path); }, "'step' is not a count", "step");
    xshard::mpi::barrier(w);
    // A parameter with a mesh of its own needs, per rank, the ranks that held it (a copy's),
    // each a rank of the file's mesh, none twice.
    const auto with_ranks = [&](std::optional<nlohmann::json> ranks, int stages = 1) {
        xshard::mpi::barrier(w); // (every rank has read the files the last check used)
        on_rank0([&] {
            auto j = nlohmann::json::parse(slurp(path + "/checkpoint.json"));
            j["step"] = 2;
            spit(path + "/checkpoint.json", j.dump());
            auto s = nlohmann::json::parse(slurp(path + "/strategy.json"));
            s["parameters"][0]["mesh"] = s["mesh"];
            s["pipeline_stages"] = stages;
            if (ranks)
                s["parameters"][0]["ranks"] = *ranks;
            spit(path + "/strategy.json", s.dump());
        });
    };
    with_ranks(std::nullopt);
    expect_io_error([&] { xshard::checkpoint_reader r(path); },
                    "has a mesh of its own without the ranks that held it", "per-rank mesh");
    if (w.size() > 1) {
        with_ranks(nlohmann::json::array({0}));
        expect_io_error([&] { xshard::checkpoint_reader r(path); },
                        "not a list of one rank per rank", "ranks too few");
    }
    std::vector<int> twice(std::size_t(w.size()), 0), past(std::size_t(w.size()), 0);
    for (int r = 0; r < w.size(); ++r)
        past[std::size_t(r)] = r + 1;
    with_ranks(nlohmann::json(past));
    expect_io_error([&] { xshard::checkpoint_reader r(path); }, "a rank of parameter",
                    "a rank past the mesh");
    // (A pipeline's strategy names ranks of every stage, a per-rank checkpoint's only its
    // mesh's.)
    with_ranks(nlohmann::json(past), 2);
    expect_io_error([&] { xshard::checkpoint_reader r(path); }, "names rank",
                    "a rank past the mesh of a per-rank checkpoint of 2 stages");
    if (w.size() > 1) {
        with_ranks(nlohmann::json(twice));
        expect_io_error([&] { xshard::checkpoint_reader r(path); }, "twice", "a rank twice");
    }
}

// --- checkpoints: round trips -----------------------------------------------------------

/// The value of element (i, j) of the tensors `indexed` fills.
double indexed_value(std::size_t i, std::size_t j) {
    return double(i * 100003 + j) * 0.5;
}
/// A [rows, cols] tensor of layout `l` on `on` whose elements are `indexed_value` of their
/// global indices (`fill`), or zeros.
dyn<double, 2> indexed(const ckpt_mesh& on, std::size_t rows, std::size_t cols, const char* l,
                       bool fill) {
    auto t = xshard::zeros<double, xshard::dynamic_layout(2)>(on, {rows, cols}, l);
    const auto b = t.block();
    for (std::size_t i = 0; fill && i < b.extent[0]; ++i)
        for (std::size_t j = 0; j < b.extent[1]; ++j)
            t.local()(i, j) = indexed_value(b.offset[0] + i, b.offset[1] + j);
    return t;
}
/// The elements of this rank's block of `t` that are not `indexed_value` of their indices.
std::size_t index_mismatches(const dyn<double, 2>& t) {
    std::size_t bad = 0;
    const auto b = t.block();
    for (std::size_t i = 0; i < b.extent[0]; ++i)
        for (std::size_t j = 0; j < b.extent[1]; ++j)
            bad += t.local()(i, j) != indexed_value(b.offset[0] + i, b.offset[1] + j);
    return bad;
}

TEST(checkpoint, copies_of_a_mesh_over_every_other_rank_save_and_load_in_both_forms) {
    // A tensor on copies of a mesh over part of the ranks (as hsdp's state sharded over part
    // of an axis), here the even and the odd ranks (not consecutive: a per-rank checkpoint
    // reads the copy holding rank 0 from rank files 0, 2, 4, ...), beside one on the whole
    // mesh; loaded onto the whole mesh and back onto the copies, exactly.
    const auto w = world();
    if (w.size() % 2)
        return;
    const ckpt_mesh m(w, {w.size(), 1});
    const auto half = w.split(w.rank() % 2, w.rank());
    const ckpt_mesh hm(half, {half.size(), 1});
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto path = scratch() + "/copies";
        xshard::save_checkpoint(
            path,
            std::tuple(xshard::parameter{"full", indexed(m, 10, 6, "[dp, -]", true)},
                       xshard::parameter{"part", indexed(hm, 9, 5, "[dp, -]", true)}),
            {.format = format});
        const xshard::checkpoint_reader r(path);
        const auto& e = *r.strategy().find("part");
        ASSERT_TRUE(e.mesh.has_value());
        std::vector<int> evens;
        for (int k = 0; k < w.size(); k += 2)
            evens.push_back(k);
        EXPECT_EQ(e.ranks, evens) << "the copy holding rank 0";
        auto whole = std::tuple(xshard::parameter{"full", indexed(m, 10, 6, "[-, dp]", false)},
                                xshard::parameter{"part", indexed(m, 9, 5, "[-, dp]", false)});
        xshard::load_checkpoint(path, whole);
        EXPECT_EQ(index_mismatches(std::get<0>(whole).value), 0u) << where(m);
        EXPECT_EQ(index_mismatches(std::get<1>(whole).value), 0u) << where(m);
        auto copies = std::tuple(xshard::parameter{"full", indexed(m, 10, 6, "[dp, -]", false)},
                                 xshard::parameter{"part", indexed(hm, 9, 5, "[-, dp]", false)});
        xshard::load_checkpoint(path, copies);
        EXPECT_EQ(index_mismatches(std::get<1>(copies).value), 0u) << where(hm);
        xshard::mpi::barrier(w);
    }
}

TEST(checkpoint, loads_into_other_layouts_in_both_forms_with_optimizer_state_and_step) {
    for_each_world_mesh([&](const ckpt_mesh& m) {
        for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
            const auto context =
                where(m) +
                (format == checkpoint_format::integrated ? ", integrated" : ", per-rank");
            const auto path = scratch() + "/ckpt";
            net saved(m, saved_layouts);
            momentum state(m, "[dp, mp]", "[mp, -]");
            saved.fill_all(5);
            state.fill_all(5);
            xshard::save_checkpoint(path, saved,
                                    {.format = format, .all_parameters = true, .step = 5}, state);

            net loaded(m, other_layouts);
            momentum loaded_state(m, "[-, -]", "[-, (mp, dp)]");
            const auto info = xshard::load_checkpoint(path, loaded, loaded_state, true);
            EXPECT_EQ(info.step, 5) << context;
            EXPECT_EQ(info.format, format) << context;
            EXPECT_EQ(info.strategy.mesh, m.shape()) << context;
            EXPECT_EQ(info.strategy.find("w1")->lay, xshard::layout("[dp, mp]")) << context;
            EXPECT_EQ(loaded.mismatches_all(5), 0u) << context;
            EXPECT_EQ(loaded_state.mismatches_all(5), 0u) << context;

            // Trainable parameters only, by default: 'counts' keeps its value.
            net trainable(m, other_layouts);
            xshard::load_checkpoint(path, trainable);
            EXPECT_EQ(trainable.mismatches_all(5, false), 0u) << context;
            const auto& counts = trainable.counts.value.local();
            EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](auto v) { return v == 0; }))
                << context;
        }
    });
}

TEST(checkpoint, a_new_save_replaces_the_previous_one_and_leaves_no_temporary) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto dir = scratch();
        net n(m, saved_layouts);
        for (std::int64_t step : {1, 2}) {
            n.fill_all(step);
            xshard::save_checkpoint(dir + "/ckpt", n, {.format = format, .step = step});
        }
        net loaded(m, other_layouts);
        EXPECT_EQ(xshard::load_checkpoint(dir + "/ckpt", loaded).step, 2);
        EXPECT_EQ(loaded.mismatches_all(2, false), 0u);
        xshard::mpi::barrier(w);
        std::vector<std::string> names;
        for (const auto& entry : fs::directory_iterator(dir))
            names.push_back(entry.path().filename().string());
        EXPECT_EQ(names, std::vector<std::string>{"ckpt"}) << "no .tmp or .old is left behind";
    }
}

TEST(files, hold_open_holds_regular_files_only_and_never_blocks) {
    const auto w = world();
    if (w.rank() != 0)
        return;
    const auto dir = fs::temp_directory_path() / ("xshard_hold_" + xshard::detail::random_suffix());
    fs::create_directories(dir);
    const auto regular = (dir / "regular").string(), fifo = (dir / "fifo").string(),
               link = (dir / "link").string();
    std::ofstream(regular) << "previous bytes";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    fs::create_symlink(regular, link);
    EXPECT_FALSE(xshard::detail::hold_open(fifo)) << "a FIFO is not held (and did not block)";
    EXPECT_FALSE(xshard::detail::hold_open(link)) << "a link is not followed";
    EXPECT_FALSE(xshard::detail::hold_open((dir / "missing").string()));
    EXPECT_FALSE(xshard::detail::hold_open(dir.string())) << "a directory is not held";
    auto held = xshard::detail::hold_open(regular);
    ASSERT_TRUE(held);
    // Unlinked while held, the file keeps its bytes for the holder; close_in_background
    // then closes it (and frees it) without the caller waiting.
    fs::remove(regular);
    std::string back(14, '\0');
    held->read_at(back.data(), back.size(), 0);
    EXPECT_EQ(back, "previous bytes");
    std::vector<xshard::detail::file> files;
    files.push_back(std::move(*held));
    xshard::detail::close_in_background(std::move(files));
    xshard::detail::close_in_background({});
    fs::remove_all(dir);
}

TEST(files, mapped_writer_interleaves_short_runs_of_all_ranks_through_reserved_mappings_only) {
    // Every rank writes runs r, r + P, ... of 4 KiB (short: through the mapping, after a
    // reserve) into one file at an odd offset, then one 64 KiB run of its own (pwrite), then a
    // short run past the reserved bytes (pwrite); rank 0 checks every byte and the CRCs.
    const auto w = world();
    const auto p = std::size_t(w.size()), me = std::size_t(w.rank());
    const auto path = scratch() + "/mapped";
    on_rank0([&] { xshard::detail::file(path, O_WRONLY | O_CREAT | O_EXCL); });
    constexpr std::size_t run = 4096, runs = 300, at = 1234, big = 65536;
    static_assert(run < xshard::detail::short_run && big >= xshard::detail::short_run);
    const auto byte_of = [](std::size_t offset) {
        return std::byte((offset * 7 + offset / 4093) & 0xff);
    };
    const auto expected = [&](std::size_t from, std::size_t n) {
        std::vector<std::byte> v(n);
        for (std::size_t i = 0; i < n; ++i)
            v[i] = byte_of(from + i);
        return v;
    };
    const std::size_t tail = at + runs * run, after = tail + p * big;
    {
        const xshard::detail::file f(path, O_RDWR);
        xshard::detail::mapped_writer writer(f, 64 << 10); // small windows: many moves
        writer.reserve(at, runs * run);
        for (std::size_t k = me; k < runs; k += p) {
            const auto bytes = expected(at + k * run, run);
            const auto crc = writer.write_checksummed(bytes.data(), run, at + k * run);
            EXPECT_EQ(crc, xshard::detail::crc32_of(bytes.data(), run));
        }
        const auto mine = expected(tail + me * big, big);
        writer.write_checksummed(mine.data(), big, tail + me * big);
        const auto last = expected(after + me * run, run);
        writer.write_checksummed(last.data(), run, after + me * run);
        EXPECT_EQ(writer.mapped_bytes(), ((runs - me + p - 1) / p) * run)
            << "the short runs reserved, and only they, go through the mapping";
    }
    // A write-only descriptor cannot be mapped: the writer falls back to pwrite.
    if (me == 0) {
        const xshard::detail::file f(path, O_WRONLY);
        xshard::detail::mapped_writer writer(f);
        writer.reserve(0, at);
        const auto head = expected(0, at);
        writer.write_checksummed(head.data(), at, 0);
        EXPECT_EQ(writer.mapped_bytes(), 0u);
    }
    xshard::mpi::barrier(w);
    on_rank0([&] {
        const auto back = slurp(path);
        ASSERT_EQ(back.size(), after + p * run);
        const auto all = expected(0, back.size());
        EXPECT_EQ(std::memcmp(back.data(), all.data(), all.size()), 0) << "the bytes written";
    });
    // A reserve past a file-size limit raises io_error, as a pwrite there would (EFBIG),
    // even inside the file (where fallocate itself would not check the limit).
    if (me == 0) {
        ::signal(SIGXFSZ, SIG_IGN);
        rlimit saved{};
        ::getrlimit(RLIMIT_FSIZE, &saved);
        rlimit small = saved;
        small.rlim_cur = 1 << 16;
        ::setrlimit(RLIMIT_FSIZE, &small);
        const xshard::detail::file f(path, O_RDWR);
        xshard::detail::mapped_writer writer(f);
        EXPECT_THROW(writer.reserve(after + p * run, std::size_t(1) << 20), xshard::io_error);
        EXPECT_THROW(writer.reserve(0, std::size_t(1) << 20), xshard::io_error);
        EXPECT_NO_THROW(writer.reserve(0, 1 << 16));
        ::setrlimit(RLIMIT_FSIZE, &saved);
    }
}

/// A SIGBUS handler that counts its calls (the one installed before xshard's guard).
int foreign_sigbus_calls = 0;
void foreign_sigbus(int) {
    ++foreign_sigbus_calls;
}

TEST(files, a_file_shrunk_under_a_mapping_is_an_io_error_and_other_sigbus_handlers_stay) {
    // Each rank maps a file of its own, which is then truncated: a load or store through the
    // mapping raises io_error (not SIGBUS), a SIGBUS of anything else still reaches the
    // handler installed before, and that handler is back in place afterwards.
    const auto w = world();
    const auto path = scratch() + "/shrinking." + std::to_string(w.rank());
    spit(path, std::string(std::size_t(256) << 10, 'x'));
    struct sigaction foreign {
    }, now{};
    foreign.sa_handler = foreign_sigbus;
    sigemptyset(&foreign.sa_mask);
    struct sigaction saved {};
    ::sigaction(SIGBUS, &foreign, &saved);
    {
        const xshard::detail::file f(path, O_RDWR);
        xshard::detail::file_window window(f, PROT_READ | PROT_WRITE, std::size_t(64) << 10);
        ASSERT_TRUE(window.map(0, 4096));
        char c = 0;
        window.access([&] { c = char(*window.at(8192)); }, "read");
        EXPECT_EQ(c, 'x');
        ::raise(SIGBUS); // not a fault of the window: the previous handler's
        EXPECT_EQ(foreign_sigbus_calls, 1);
        ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
        window.access([&] { c = char(*window.at(100)); }, "read"); // still in the file
        EXPECT_EQ(c, 'x');
        try {
            window.access([&] { c = char(*window.at(8192)); }, "read");
            ADD_FAILURE() << "a load past the end of a shrunk file did not raise";
        } catch (const io_error& e) {
            EXPECT_NE(std::string(e.what()).find(path + " shrank while it was read"),
                      std::string::npos)
                << e.what();
        }
        // The same through the writer, in space it reserved before the file shrank.
        xshard::detail::mapped_writer writer(f);
        writer.reserve(0, std::size_t(128) << 10);
        ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
        const std::vector<std::byte> run(4096, std::byte{7});
        EXPECT_THROW(writer.write_checksummed(run.data(), run.size(), 65536), io_error);
        EXPECT_NO_THROW(writer.write_checksummed(run.data(), run.size(), 0));
    }
    ::sigaction(SIGBUS, nullptr, &now);
    EXPECT_EQ(now.sa_handler, &foreign_sigbus) << "the handler installed before is restored";
    ::sigaction(SIGBUS, &saved, nullptr);
    fs::remove(path);
}

TEST(files, a_pass_over_a_file_takes_the_faster_way_per_byte_after_timing_both) {
    // Small pieces are not timed but still take turns (so a small file exercises both ways);
    // timed pieces go to the way with fewer of them until each has its trials.
    xshard::detail::read_chooser choice(2, 1000);
    std::vector<bool> ways;
    for (int i = 0; i < 4; ++i) {
        ways.push_back(choice.map_next());
        choice.took(ways.back(), 10, 1.0);
    }
    EXPECT_EQ(ways, (std::vector<bool>{true, false, true, false}));
    choice.took(true, 1000, 1e-3); // mapped: 1 us per byte, then the copy's turns
    EXPECT_FALSE(choice.map_next());
    choice.took(false, 2000, 1e-3); // copied: 0.5 us per byte
    EXPECT_TRUE(choice.map_next());
    choice.took(true, 1000, 1e-3);
    EXPECT_FALSE(choice.map_next());
    choice.took(false, 2000, 1e-3);
    EXPECT_FALSE(choice.map_next()) << "copying is faster per byte";
    choice.took(true, 1 << 20, 1e-9); // past the trials: no longer timed
    EXPECT_FALSE(choice.map_next());

    xshard::detail::read_chooser mapping_wins(1, 1);
    mapping_wins.took(true, 4000, 1e-3);
    mapping_wins.took(false, 1000, 1e-3);
    EXPECT_TRUE(mapping_wins.map_next()) << "mapping is faster per byte";
}

TEST(checkpoint, refuses_partial_tensors) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    auto p =
        xshard::zeros<double, xshard::dynamic_layout(2)>(m, {4, 4}, "[dp, -] partial(sum: mp)");
    const auto dir = scratch();
    EXPECT_THROW(xshard::save_checkpoint(dir + "/c", std::tuple(xshard::parameter{"p", p})),
                 xshard::error);
}

// --- checkpoints: damage ----------------------------------------------------------------

/// Loading `path` into a model holding sentinel values raises io_error mentioning `what` on
/// every rank, and leaves every value of the model and of the optimizer state as it was
/// (a load is all or nothing).
void expect_refused(const ckpt_mesh& m, const std::string& path, const std::string& what,
                    const std::string& context) {
    net n(m, other_layouts);
    momentum state(m, "[dp, -]", "[-, mp]");
    n.fill_all(9);
    state.fill_all(9);
    expect_io_error([&] { xshard::load_checkpoint(path, n, state, true); }, what,
                    context + " (" + where(m) + ")");
    EXPECT_EQ(n.mismatches_all(9), 0u) << context << ": the model changed";
    EXPECT_EQ(state.mismatches_all(9), 0u) << context << ": the optimizer state changed";
}

/// A checkpoint of `format` saved from the 'saved' layouts on `m`, in a new directory.
std::string saved_checkpoint(const ckpt_mesh& m, checkpoint_format format) {
    const auto path = scratch() + "/ckpt";
    net n(m, saved_layouts);
    momentum state(m, "[dp, mp]", "[mp, -]");
    n.fill_all();
    state.fill_all();
    xshard::save_checkpoint(path, n, {.format = format, .all_parameters = true}, state);
    return path;
}

TEST(checkpoint, damaged_integrated_files_raise_everywhere_and_change_nothing) {
    const auto w = world();
    const ckpt_mesh m(w, {2 - w.size() % 2, w.size() / (2 - w.size() % 2)});
    const auto path = saved_checkpoint(m, checkpoint_format::integrated);
    const auto bytes = slurp(path);
    const auto h = xshard::checkpoint_reader(path).header(0);
    const auto w1 = h.data_start + h.find("w1")->begin;

    struct damage {
        std::string name, what;
        std::function<void(const std::string&)> make;
    };
    const std::vector<damage> cases{
        {"truncated in the data", "beyond the file",
         [&](auto& to) {
             spit(to, bytes.substr(0, bytes.size() - 3));
         }},
        {"truncated in the length", "shorter than its 8-byte header length",
         [&](auto& to) {
             spit(to, bytes.substr(0, 5));
         }},
        {"truncated in the header", "does not fit the file",
         [&](auto& to) {
             spit(to, bytes.substr(0, 100));
         }},
        {"a flipped data byte", "checksum mismatch in w1",
         [&](auto& to) {
             auto b = bytes;
             b[w1 + 17] = char(b[w1 + 17] ^ 0x10);
             spit(to, b);
         }},
        {"a flipped header byte", "not valid JSON",
         [&](auto& to) {
             auto b = bytes;
             b[8] = '}';
             spit(to, b);
         }},
        {"an absurd header length", "does not fit the file",
         [&](auto& to) {
             auto b = bytes;
             b[6] = '\x7f';
             spit(to, b);
         }},
        {"offsets beyond the file", "data offsets beyond the file",
         [&](auto& to) {
             edit_header(path, to, [](auto& j) { j["w1"]["data_offsets"][1] = 1ull << 40; });
         }},
        {"an absurd shape", "shape larger than the file",
         [&](auto& to) {
             edit_header(path, to, [](auto& j) { j["w1"]["shape"] = {1ull << 40, 1ull << 40}; });
         }},
        {"a wrong dtype", "is stored as F32",
         [&](auto& to) {
             edit_header(path, to, [](auto& j) {
                 j["w1"]["dtype"] = "F32";
                 j["w1"]["shape"] = {12, 20};
                 j["__metadata__"].erase("xshard.strategy");
             });
         }},
        {"a missing tensor", "no tensor 'optimizer.momentum.w2'",
         [&](auto& to) {
             edit_header(path, to, [](auto& j) {
                 j.erase("optimizer.momentum.w2");
                 j["__metadata__"].erase("xshard.strategy");
             });
         }},
        {"not a file", "cannot open",
         [&](auto&) {
         }},
    };
    for (const auto& c : cases) {
        const auto to = path + ".damaged";
        on_rank0([&] {
            fs::remove(to);
            c.make(to);
        });
        expect_refused(m, to, c.what, c.name);
    }
}

TEST(checkpoint, damaged_per_rank_directories_raise_everywhere_and_change_nothing) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const auto path = saved_checkpoint(m, checkpoint_format::per_rank);
    const auto last = xshard::detail::rank_file(path, w.size() - 1);
    const auto bytes = slurp(last);
    const auto h = xshard::checkpoint_reader(path).header(w.size() - 1);
    const auto at =
        h.data_start + h.find("w1")->begin; // w1 is split: every file holds a block of it

    struct damage {
        std::string name, what;
        std::function<void(const std::string&)> make;
    };
    const std::vector<damage> cases{
        {"a flipped data byte", "checksum mismatch in w1",
         [&](auto& to) {
             auto b = bytes;
             b[at + 3] = char(b[at + 3] ^ 0x01);
             spit(xshard::detail::rank_file(to, w.size() - 1), b);
         }},
        {"a truncated rank file", "beyond the file",
         [&](auto& to) {
             spit(xshard::detail::rank_file(to, w.size() - 1), bytes.substr(0, bytes.size() - 1));
         }},
        {"a missing rank file", "rank file(s) for a mesh of",
         [&](auto& to) {
             fs::remove(xshard::detail::rank_file(to, w.size() - 1));
         }},
        {"a damaged strategy file", "malformed strategy file",
         [&](auto& to) {
             spit(to + "/strategy.json", "{\"format\": \"xshard-strategy\", \"version\": 1");
         }},
        {"a rank file not as its strategy says", "as its strategy says",
         [&](auto& to) {
             edit_header(xshard::detail::rank_file(path, w.size() - 1),
                         xshard::detail::rank_file(to, w.size() - 1),
                         [](auto& j) { j.erase("w1"); });
         }},
    };
    for (const auto& c : cases) {
        const auto to = path + ".damaged";
        on_rank0([&] {
            fs::remove_all(to);
            fs::copy(path, to);
            c.make(to);
        });
        expect_refused(m, to, c.what, c.name);
    }
}

TEST(checkpoint, block_checksums_catch_damage_and_the_model_stays_as_it_was) {
    // Saved on (1, p) in the 'saved' layouts; a byte of w1 ([dp, mp]: a block per rank)
    // flipped in the last rank's block. Loaded in the saved layouts (each rank reads its own
    // block whole) or in w1 [mp, dp] (the blocks straddle the load's when p > 1), every rank
    // raises, naming w1, and nothing of the model or of the optimizer state changes.
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const auto path = saved_checkpoint(m, checkpoint_format::integrated);
    const xshard::checkpoint_reader r(path);
    const auto& w1 = *r.strategy().find("w1");
    const auto blocks = r.blocks(w1);
    ASSERT_EQ(blocks.size(), std::size_t(w.size()));
    EXPECT_EQ(blocks.back().offset,
              (std::vector<std::size_t>{
                  0, xshard::block_offset(10, std::size_t(w.size()), std::size_t(w.size() - 1))}));
    const auto at = r.segments(w1, blocks.back()).back();
    on_rank0([&] {
        auto b = slurp(path);
        b[at.first + 1] = char(b[at.first + 1] ^ 0x08);
        spit(path + ".damaged", b);
    });
    {
        net n(m, saved_layouts);
        momentum state(m, "[dp, mp]", "[mp, -]");
        n.fill_all(9);
        state.fill_all(9);
        expect_io_error([&] { xshard::load_checkpoint(path + ".damaged", n, state, true); },
                        "checksum mismatch in w1", "saved layouts");
        EXPECT_EQ(n.mismatches_all(9), 0u) << "the saved layouts: the model changed";
        EXPECT_EQ(state.mismatches_all(9), 0u) << "the saved layouts: the state changed";
    }
    expect_refused(m, path + ".damaged", "checksum mismatch in w1", "other layouts");
    if (w.size() > 1) { // w1 [mp, dp] splits rows, the stored blocks columns: nothing changes
        net n(m, other_layouts);
        n.fill_all(9);
        expect_io_error([&] { xshard::load_checkpoint(path + ".damaged", n); },
                        "checksum mismatch in w1", "other layouts");
        EXPECT_EQ(n.mismatches_all(9, false), 0u) << "a shared check changes nothing";
    }
}

/// The bytes the ranks of `m` have read together for their node (node_io.hpp), summed.
std::size_t node_bytes(const ckpt_mesh& m) {
    auto n = xshard::detail::node_file_io::of(m.comm()).bytes_read();
    xshard::mpi::allreduce(m.comm(), std::span(&n, 1), xshard::reduction::sum);
    return n;
}

/// Column splits of wide rows are stored in short runs: rows of 3072 doubles (24 KiB) split
/// over W ranks give each rank runs of 24/W KiB (W >= 2: short; 1: one long run, read); a
/// [2000, 16] tensor gives runs of 128/W bytes. The ranks of a node write and read such tensors
/// together (each a slice, node_io.hpp); without the shared-memory transport each copies its runs
/// out of a mapping of the file (format.hpp read_block). Either way, loaded into the saved
/// layout or a coarser one the values are exact, and a flipped byte in a run raises a
/// checksum mismatch on every rank; a file truncated while it is read raises io_error on the
/// ranks reading it.
TEST(checkpoint, short_runs_load_together_or_through_a_mapping_exactly_and_checked) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const auto path = scratch() + "/wide.safetensors";
    const auto written_before = xshard::detail::node_file_io::of(m.comm()).bytes_written();
    xshard::save_checkpoint(
        path, std::tuple(xshard::parameter{"wide", indexed(m, 700, 3072, "[-, mp]", true)},
                         xshard::parameter{"tall", indexed(m, 2000, 16, "[-, mp]", true)}));
    const std::size_t stored = (700 * 3072 + 2000 * 16) * sizeof(double);
    // Saved by the node together (each byte once), its data page-aligned in the file.
    std::size_t written =
        xshard::detail::node_file_io::of(m.comm()).bytes_written() - written_before;
    xshard::mpi::allreduce(m.comm(), std::span(&written, 1), xshard::reduction::sum);
    EXPECT_EQ(written, w.size() > 1 ? stored : 0) << where(m);
    EXPECT_EQ(xshard::checkpoint_reader(path).header(0).data_start % 4096, 0u) << where(m);
    auto loaded = std::tuple(xshard::parameter{"wide", indexed(m, 700, 3072, "[-, mp]", false)},
                             xshard::parameter{"tall", indexed(m, 2000, 16, "[-, mp]", false)});
    const auto before = node_bytes(m);
    xshard::load_checkpoint(path, loaded);
    EXPECT_EQ(index_mismatches(std::get<0>(loaded).value), 0u) << where(m);
    EXPECT_EQ(index_mismatches(std::get<1>(loaded).value), 0u) << where(m);
    // Each stored byte read once by the node (one rank: by the rank alone).
    EXPECT_EQ(node_bytes(m) - before, w.size() > 1 ? stored : 0) << where(m);
    // Into a replicated layout: every rank takes every stored block from the node's windows.
    auto whole = std::tuple(xshard::parameter{"wide", indexed(m, 700, 3072, "[-, -]", false)},
                            xshard::parameter{"tall", indexed(m, 2000, 16, "[-, -]", false)});
    xshard::load_checkpoint(path, whole);
    EXPECT_EQ(index_mismatches(std::get<0>(whole).value), 0u) << where(m);
    EXPECT_EQ(index_mismatches(std::get<1>(whole).value), 0u) << where(m);
    EXPECT_EQ(node_bytes(m) - before, w.size() > 1 ? 2 * stored : 0) << where(m);
    // The same mesh without the shared-memory transport: each rank reads its runs alone.
    ::setenv("XSHARD_SHARED_MEMORY", "0", 1);
    const ckpt_mesh alone(w, {1, w.size()});
    EXPECT_FALSE(xshard::detail::node_file_io::of(alone.comm())) << where(m);
    ::unsetenv("XSHARD_SHARED_MEMORY");
    auto apart = std::tuple(xshard::parameter{"wide", indexed(alone, 700, 3072, "[-, mp]", false)},
                            xshard::parameter{"tall", indexed(alone, 2000, 16, "[-, mp]", false)});
    xshard::load_checkpoint(path, apart);
    EXPECT_EQ(index_mismatches(std::get<0>(apart).value), 0u) << where(m);
    EXPECT_EQ(index_mismatches(std::get<1>(apart).value), 0u) << where(m);
    EXPECT_EQ(node_bytes(alone), 0u) << where(m);
    // A byte of the last rank's run in the middle row of 'wide' flipped (W = 1: of the
    // tensor's one run).
    const xshard::checkpoint_reader r(path);
    const auto& e = *r.strategy().find("wide");
    const auto segments = r.segments(e, r.blocks(e).back()); // one at W = 1
    const auto at = segments[std::min<std::size_t>(350, segments.size() - 1)].first + 3;
    on_rank0([&] {
        auto b = slurp(path);
        b[at] = char(b[at] ^ 0x10);
        spit(path + ".damaged", b);
    });
    expect_io_error([&] { xshard::load_checkpoint(path + ".damaged", loaded); },
                    "checksum mismatch in wide", "a short run, read together");
    expect_io_error([&] { xshard::load_checkpoint(path + ".damaged", apart); },
                    "checksum mismatch in wide", "a short run, read alone");
    // Neither load changed anything: the values are still those loaded before.
    EXPECT_EQ(index_mismatches(std::get<0>(loaded).value), 0u) << "changed, " << where(m);
    EXPECT_EQ(index_mismatches(std::get<1>(loaded).value), 0u) << "changed, " << where(m);
    EXPECT_EQ(index_mismatches(std::get<0>(apart).value), 0u) << "changed, " << where(m);
    EXPECT_EQ(index_mismatches(std::get<1>(apart).value), 0u) << "changed, " << where(m);
    // Truncated (by "another process") after a first read of this rank's block of 'wide'.
    on_rank0([&] { spit(path + ".shrinking", slurp(path)); });
    const xshard::checkpoint_reader shrinking(path + ".shrinking");
    const auto& entry = *shrinking.strategy().find("wide");
    const auto block = shrinking.blocks(entry).at(std::size_t(w.rank()));
    std::vector<std::byte> out(block.size() * sizeof(double));
    EXPECT_EQ(xshard::detail::crc_hex(
                  shrinking.read_block(entry, block, block.offset, block.extent, out.data())),
              *shrinking.checksum(entry, block));
    xshard::mpi::barrier(w);
    on_rank0([&] { ASSERT_EQ(::truncate((path + ".shrinking").c_str(), 4096), 0); });
    xshard::mpi::barrier(w);
    try {
        shrinking.read_block(entry, block, block.offset, block.extent, out.data());
        ADD_FAILURE() << "reading a truncated file did not raise" << where(m);
    } catch (const io_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(w.size() > 1 ? "shrank while it was read" : "is truncated"),
                  std::string::npos)
            << what << where(m);
    }
}

/// The node's reader and writer for the ranks of `m` (node_io.hpp): there when they are
/// several (on this one machine), not at one rank (null).
xshard::detail::node_file_io* node_of(const ckpt_mesh& m) {
    auto& node = xshard::detail::node_file_io::of(m.comm());
    if (m.comm().size() == 1) {
        EXPECT_FALSE(node);
        return nullptr;
    }
    EXPECT_TRUE(node) << where(m);
    return node ? &node : nullptr;
}

/// The node reader hands every rank each window of a range, in order, with the file's bytes
/// (ranges empty, of one byte, just under and over a window, over several windows, at any
/// offset); a read failing on one rank (past the end of the file) or a `take` throwing on one
/// rank raises on every rank, and the next read works.
TEST(node_file_io, ranks_read_ranges_together_and_fail_together) {
    using xshard::detail::node_file_io;
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    auto* shared = node_of(m);
    if (!shared)
        return;
    auto& node = *shared;
    constexpr std::size_t window = node_file_io::window_bytes;
    const std::size_t size = 3 * window + 12345;
    std::string bytes(size, '\0');
    for (std::size_t i = 0; i < size; ++i)
        bytes[i] = char((i * 131 + i / 4093) & 0xff);
    const auto path = scratch() + "/bytes";
    on_rank0([&] { spit(path, bytes); });
    const xshard::detail::file f(path, O_RDONLY);
    for (const auto& [begin, length] : std::vector<std::pair<std::size_t, std::size_t>>{
             {0, 0}, {5, 1}, {7, window - 1}, {4096, window + 1}, {1, size - 1}, {0, size}}) {
        std::string got(length, '\0');
        std::size_t next = begin, windows = 0;
        node.read(f, begin, length, [&](std::size_t lo, std::size_t hi, const std::byte* b) {
            EXPECT_EQ(lo, next);
            EXPECT_TRUE(hi > lo && hi - lo <= window);
            std::memcpy(got.data() + (lo - begin), b, hi - lo);
            next = hi;
            ++windows;
        });
        const auto context =
            "range at " + std::to_string(begin) + " of " + std::to_string(length) + where(m);
        EXPECT_EQ(next, begin + length) << context;
        EXPECT_EQ(windows, (length + window - 1) / window) << context;
        EXPECT_TRUE(got == bytes.substr(begin, length)) << context;
    }
    // Runs read straight in: rank r owns the runs of 1000 bytes whose number is r modulo the
    // ranks, over three windows and a bit at an odd offset. The parts of its runs in its own
    // slice of a window it reads to their place; it copies the rest out of the window.
    {
        const std::size_t begin = 777, length = 3 * window + 4321, run = 1000;
        std::string got(length, '\0');
        std::vector<node_file_io::direct_run> direct;
        for (std::size_t at = 0, j = 0; at < length; at += run, ++j)
            if (j % std::size_t(w.size()) == std::size_t(w.rank()))
                direct.push_back({begin + at, reinterpret_cast<std::byte*>(got.data() + at),
                                  std::min(run, length - at)});
        std::size_t next = 0, in_place = 0;
        node.read(f, begin, length, direct,
                  [&](std::size_t lo, std::size_t hi, const std::byte* b) {
                      const auto [from, to] = node.slice(lo, hi);
                      EXPECT_TRUE(lo <= from && from <= to && to <= hi);
                      for (; next < direct.size() && direct[next].at < hi; ++next) {
                          const auto& d = direct[next];
                          for (auto at = std::max(d.at, lo); at < std::min(d.at + d.n, hi); ++at) {
                              if (at >= from && at < to)
                                  ++in_place;
                              else
                                  got[at - begin] = char(b[at - lo]);
                          }
                          if (d.at + d.n > hi)
                              break; // continues in the next window
                      }
                  });
        std::size_t wrong = 0, owned = 0;
        for (const auto& d : direct) {
            owned += d.n;
            for (std::size_t i = d.at; i < d.at + d.n; ++i)
                wrong += got[i - begin] != bytes[i];
        }
        EXPECT_EQ(wrong, 0u) << "runs read straight in" << where(m);
        // Each rank reads about 1/W of its runs itself (its slices are 1/W of each window).
        EXPECT_GT(in_place, 0u) << where(m);
        EXPECT_LT(in_place, owned) << where(m);
    }
    const auto take_nothing = [](std::size_t, std::size_t, const std::byte*) {
    };
    // A window reaching 1000 bytes past the end: only the last rank's slice is short.
    const int last = w.size() - 1;
    try {
        node.read(f, size + 1000 - window, window, take_nothing);
        ADD_FAILURE() << "a read past the end did not raise" << where(m);
    } catch (const io_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(w.rank() == last ? "is truncated"
                                             : "together with rank " + std::to_string(last)),
                  std::string::npos)
            << what << where(m);
    }
    // A take throwing on rank 0 only: rank 0 has its own exception, the others name it.
    try {
        node.read(f, 0, 2 * window + 1, [&](std::size_t lo, std::size_t, const std::byte*) {
            if (w.rank() == 0 && lo > 0)
                throw std::runtime_error("take failed");
        });
        ADD_FAILURE() << "a failing take did not raise" << where(m);
    } catch (const io_error& e) {
        EXPECT_NE(w.rank(), 0) << e.what();
        EXPECT_NE(std::string(e.what()).find("together with rank 0"), std::string::npos)
            << e.what() << where(m);
    } catch (const std::runtime_error& e) {
        EXPECT_EQ(w.rank(), 0) << e.what();
    }
    std::string again(window, '\0');
    node.read(f, 3, window, [&](std::size_t lo, std::size_t hi, const std::byte* b) {
        std::memcpy(again.data() + (lo - 3), b, hi - lo);
    });
    EXPECT_TRUE(again == bytes.substr(3, window)) << "a read after the failures" << where(m);
}

/// The node writer puts each byte of a range into the file from the one rank whose runs hold
/// it: runs of 1000 bytes (and a last short one) dealt to the ranks in turn, over three
/// windows and a bit at an odd offset; ranges of one byte and of less than a window; every
/// byte around the range is left as it was. Each rank sees each of its runs' bytes once, in
/// order. A write failing on one rank (a descriptor it opened read-only) or a `visit`
/// throwing on one rank raises on every rank, and the next write works.
TEST(node_file_io, ranks_write_ranges_together_and_fail_together) {
    using xshard::detail::node_file_io;
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    auto* shared = node_of(m);
    if (!shared)
        return;
    auto& node = *shared;
    constexpr std::size_t window = node_file_io::window_bytes;
    const std::size_t size = 3 * window + 12345;
    const auto byte_at = [](std::size_t i) {
        return char((i * 151 + i / 4091 + 7) & 0xff);
    };
    const auto path = scratch() + "/written";
    const std::string filler(size + 2000, '\xee');
    const std::size_t before = node.bytes_written();
    std::size_t wrote = 0; // in the ranges below, summed over the ranks
    for (const auto& [begin, length, run] :
         std::vector<std::array<std::size_t, 3>>{{5, 1, 1000},
                                                 {7, window - 1, 1000},
                                                 {777, 3 * window + 4321, 1000},
                                                 {0, size, 4096}}) {
        on_rank0([&] { spit(path, filler); });
        // This rank's runs, their bytes packed one after the other in `mine`.
        std::vector<node_file_io::source_run> runs;
        std::string mine;
        for (std::size_t at = 0, j = 0; at < length; at += run, ++j)
            if (j % std::size_t(w.size()) == std::size_t(w.rank()))
                for (std::size_t i = begin + at; i < begin + std::min(length, at + run); ++i)
                    mine += byte_at(i);
        for (std::size_t at = 0, j = 0, packed = 0; at < length; at += run, ++j)
            if (j % std::size_t(w.size()) == std::size_t(w.rank())) {
                const auto n = std::min(run, length - at);
                runs.push_back(
                    {begin + at, reinterpret_cast<const std::byte*>(mine.data()) + packed, n});
                packed += n;
            }
        std::string seen; // the pieces `visit` was given, in turn
        std::size_t last_run = 0;
        bool in_order = true;
        {
            const xshard::detail::file f(path, O_WRONLY);
            const auto visit = [&](std::size_t i, const std::byte* b, std::size_t n) {
                in_order = in_order && i >= last_run && i < runs.size() && b >= runs[i].bytes &&
                           b + n <= runs[i].bytes + runs[i].n;
                last_run = i;
                seen.append(reinterpret_cast<const char*>(b), n);
            };
            node.write(f, begin, length, runs, visit);
        }
        const auto context =
            "range at " + std::to_string(begin) + " of " + std::to_string(length) + where(m);
        EXPECT_TRUE(in_order) << context;
        EXPECT_TRUE(seen == mine) << "the pieces visited are this rank's runs" << context;
        wrote += length;
        xshard::mpi::barrier(w);
        const auto back = slurp(path);
        ASSERT_EQ(back.size(), filler.size()) << context;
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < back.size(); ++i)
            wrong += back[i] != (i >= begin && i < begin + length ? byte_at(i) : '\xee');
        EXPECT_EQ(wrong, 0u) << context;
        xshard::mpi::barrier(w);
    }
    std::size_t written = node.bytes_written() - before;
    xshard::mpi::allreduce(w, std::span(&written, 1), xshard::reduction::sum);
    EXPECT_EQ(written, wrote) << "each byte written once by the node" << where(m);
    const int last = w.size() - 1;
    std::vector<node_file_io::source_run> none;
    const auto visit_nothing = [](std::size_t, const std::byte*, std::size_t) {
    };
    // The last rank's descriptor is read-only: its pwritev fails.
    try {
        const xshard::detail::file f(path, w.rank() == last ? O_RDONLY : O_WRONLY);
        node.write(f, 0, 2 * window, none, visit_nothing);
        ADD_FAILURE() << "a failing write did not raise" << where(m);
    } catch (const io_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(w.rank() == last ? "cannot write"
                                             : "together with rank " + std::to_string(last)),
                  std::string::npos)
            << what << where(m);
    }
    // A visit throwing on rank 0 only (in the second window): rank 0 has its own exception,
    // the others name it.
    const std::string ones(2 * window, '\x01');
    const std::vector<node_file_io::source_run> all_of_it{
        {0, reinterpret_cast<const std::byte*>(ones.data()), ones.size()}};
    try {
        const xshard::detail::file f(path, O_WRONLY);
        node.write(f, 0, ones.size(), w.rank() == 0 ? std::span(all_of_it) : std::span(none),
                   [&](std::size_t, const std::byte* b, std::size_t) {
                       if (b > reinterpret_cast<const std::byte*>(ones.data()))
                           throw std::runtime_error("visit failed");
                   });
        ADD_FAILURE() << "a failing visit did not raise" << where(m);
    } catch (const io_error& e) {
        EXPECT_NE(w.rank(), 0) << e.what();
        EXPECT_NE(std::string(e.what()).find("together with rank 0"), std::string::npos)
            << e.what() << where(m);
    } catch (const std::runtime_error& e) {
        EXPECT_EQ(w.rank(), 0) << e.what();
    }
    // Then a write of rank 0's bytes over the first window works.
    {
        const xshard::detail::file f(path, O_WRONLY);
        const std::vector<node_file_io::source_run> first{
            {0, reinterpret_cast<const std::byte*>(ones.data()), window}};
        node.write(f, 0, window, w.rank() == 0 ? std::span(first) : std::span(none), visit_nothing);
    }
    xshard::mpi::barrier(w);
    EXPECT_TRUE(slurp(path).substr(0, window) == ones.substr(0, window))
        << "a write after the failures" << where(m);
}

TEST(checkpoint, version_1_files_load_and_malformed_block_checksums_are_refused) {
    // Version 1 (one CRC per tensor, no block checksums) as earlier saves wrote it: loads,
    // and its damage is caught.
    const auto w = world();
    const ckpt_mesh m(w, {2 - w.size() % 2, w.size() / (2 - w.size() % 2)});
    const auto path = saved_checkpoint(m, checkpoint_format::integrated);
    const auto v1 = path + ".v1", bad = path + ".bad";
    on_rank0([&] {
        edit_header(path, v1, [](auto& j) {
            j["__metadata__"].erase("xshard.block_crc32");
            j["__metadata__"]["xshard.version"] = "1";
        });
        edit_header(path, bad, [](auto& j) {
            auto blocks = nlohmann::json::parse(
                j["__metadata__"]["xshard.block_crc32"].template get<std::string>());
            blocks["w1"] = blocks["w1"].template get<std::string>() + "00000000";
            j["__metadata__"]["xshard.block_crc32"] = blocks.dump();
        });
    });
    EXPECT_EQ(xshard::checkpoint_reader(v1)
                  .blocks(*xshard::checkpoint_reader(v1).strategy().find("w1"))
                  .size(),
              1u);
    net n(m, other_layouts);
    momentum state(m, "[-, mp]", "[(mp, dp), -]");
    xshard::load_checkpoint(v1, n, state, true);
    EXPECT_EQ(n.mismatches_all(), 0u) << where(m);
    EXPECT_EQ(state.mismatches_all(), 0u) << where(m);
    expect_refused(m, bad,
                   "'w1' has " + std::to_string(m.shape().size() + 1) + " block checksums for " +
                       std::to_string(m.shape().size()) + " stored blocks",
                   "a block checksum too many");
    on_rank0([&] {
        auto b = slurp(v1);
        const auto h = xshard::checkpoint_reader(v1).header(0);
        const auto at = h.data_start + h.find("w2")->begin + 5;
        b[at] = char(b[at] ^ 0x01);
        spit(bad, b);
    });
    expect_refused(m, bad, "checksum mismatch in w2", "version 1, damaged");
}

TEST(checkpoint, a_model_that_does_not_match_raises_everywhere) {
    const auto w = world();
    const ckpt_mesh m(w, {w.size(), 1});
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto path = saved_checkpoint(m, format);
        auto wide = std::tuple(xshard::parameter{
            "w1", xshard::zeros<double, xshard::dynamic_layout(2)>(m, {12, 11}, "[-, dp]")});
        expect_io_error([&] { xshard::load_checkpoint(path, wide); },
                        "stored with shape (12, 10), the model has (12, 11)", "shape");
        auto single = std::tuple(xshard::parameter{
            "w1", xshard::zeros<float, xshard::dynamic_layout(2)>(m, {12, 10}, "[-, dp]")});
        expect_io_error([&] { xshard::load_checkpoint(path, single); },
                        "'w1' is stored as F64, the model has F32", "dtype");
        auto extra = std::tuple(xshard::parameter{
            "extra", xshard::zeros<double, xshard::dynamic_layout(1)>(m, {3}, "[-]")});
        expect_io_error([&] { xshard::load_checkpoint(path, extra); }, "no tensor 'extra'",
                        "missing");
    }
}

// --- checkpoints: names, paths and what is already there --------------------------------

/// A user type with two parameters of one name.
struct twice {
    dyn<double, 1> a, b;
    friend void visit_parameters(twice& t, auto&& visit) {
        visit("x", t.a);
        visit("x", t.b);
    }
};

TEST(checkpoint, duplicate_and_reserved_names_are_refused_in_every_container) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const auto path = scratch() + "/ckpt";
    auto t = [&] {
        return xshard::zeros<double, xshard::dynamic_layout(1)>(m, {6}, "[mp]");
    };
    const auto expect = [&](auto&& container, const std::string& what, const std::string& kind) {
        for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
            try {
                xshard::save_checkpoint(path, container, {.format = format});
                ADD_FAILURE() << kind << ": saved";
            } catch (const xshard::error& e) {
                EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
                    << kind << ": " << e.what();
            }
            try {
                xshard::load_checkpoint(path, container);
                ADD_FAILURE() << kind << ": loaded";
            } catch (const xshard::error& e) {
                EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
                    << kind << ": " << e.what();
            }
        }
        EXPECT_FALSE(fs::exists(path)) << kind << ": something was written";
    };
    expect(std::tuple(xshard::parameter{"x", t()}, xshard::parameter{"x", t()}),
           "two parameters are named 'x'", "tuple");
    std::vector<xshard::parameter<dyn<double, 1>>> v{{"y", t()}, {"z", t()}, {"y", t()}};
    expect(v, "two parameters are named 'y'", "vector");
    twice u{t(), t()};
    expect(u, "two parameters are named 'x'", "user type");
    expect(std::tuple(xshard::parameter{"__metadata__", t()}), "'__metadata__'", "reserved");
}

TEST(checkpoint, saves_create_missing_directories) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto path = scratch() + "/not/there/yet/ckpt";
        net n(m, saved_layouts);
        n.fill_all(4);
        xshard::save_checkpoint(path, n, {.format = format, .step = 4});
        net loaded(m, other_layouts);
        EXPECT_EQ(xshard::load_checkpoint(path, loaded).step, 4);
        EXPECT_EQ(loaded.mismatches_all(4, false), 0u);
    }
    // A strategy file too.
    const auto path = scratch() + "/not/there/strategy.json";
    net n(m, saved_layouts);
    xshard::save_strategy_file(path, n);
    EXPECT_EQ(xshard::load_strategy_file(path).parameters.size(),
              xshard::strategy_of(n).parameters.size());
}

TEST(checkpoint, never_replaces_or_removes_what_is_not_a_checkpoint) {
    // A valid safetensors file without xshard's metadata: one float64 tensor of 1.0.
    const std::string json = R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
    std::string foreign_safetensors(8, '\0');
    foreign_safetensors[0] = char(json.size());
    foreign_safetensors += json + std::string("\0\0\0\0\0\0\xf0\x3f", 8);
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    net n(m, saved_layouts);
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto dir = scratch();
        const auto path = dir + "/ckpt", victim = dir + "/victim.txt";
        // A directory of the user's files, a user's file, a link to the user's file, an
        // empty file, another program's safetensors file.
        const std::vector<std::pair<std::string, std::function<void()>>> cases{
            {"a directory of the user's files",
             [&] {
                 fs::create_directories(path);
                 spit(path + "/notes.txt", "mine");
             }},
            {"a directory with the user's strategy.json",
             [&] {
                 fs::create_directories(path);
                 spit(path + "/strategy.json", "mine");
             }},
            {"a user's file",
             [&] {
                 spit(path, "mine");
             }},
            {"a link",
             [&] {
                 fs::create_symlink(victim, path);
             }},
            {"an empty file",
             [&] {
                 spit(path, "");
             }},
            {"another program's safetensors file",
             [&] {
                 spit(path, foreign_safetensors);
             }},
        };
        for (const auto& [name, make] : cases) {
            on_rank0([&] {
                fs::remove_all(path);
                spit(victim, "mine");
                make();
            });
            const bool file = fs::is_regular_file(fs::symlink_status(path));
            const auto kept = file ? slurp(path) : std::string();
            xshard::mpi::barrier(w);
            expect_io_error([&] { xshard::save_checkpoint(path, n, {.format = format}); },
                            name == "another program's safetensors file"
                                ? "is a safetensors file that xshard did not write"
                                : "replaces only its own checkpoints",
                            name);
            xshard::mpi::barrier(w);
            EXPECT_EQ(slurp(victim), "mine") << name;
            EXPECT_TRUE(fs::exists(fs::symlink_status(path))) << name << " was removed";
            if (fs::is_directory(fs::symlink_status(path))) {
                EXPECT_EQ(std::distance(fs::directory_iterator(path), {}), 1) << name;
            } else if (file) {
                EXPECT_EQ(slurp(path), kept) << name << " was overwritten";
            }
            std::vector<std::string> left;
            for (const auto& e : fs::directory_iterator(dir))
                left.push_back(e.path().filename().string());
            EXPECT_EQ(left.size(), 2u) << name << ": a temporary was left behind";
            xshard::mpi::barrier(w);
        }
    }
}

TEST(checkpoint, planted_links_at_temporary_names_are_not_followed) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    net n(m, saved_layouts);
    n.fill_all(6);
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto dir = scratch();
        const auto path = dir + "/ckpt", victim = dir + "/victim.txt";
        on_rank0([&] {
            spit(victim, "mine");
            // The names a save used to write through.
            for (const auto& name : {path + ".tmp", path + ".tmp." + std::to_string(::getpid())})
                fs::create_symlink(victim, name);
        });
        xshard::save_checkpoint(path, n, {.format = format, .step = 6});
        net loaded(m, other_layouts);
        EXPECT_EQ(xshard::load_checkpoint(path, loaded).step, 6);
        EXPECT_EQ(loaded.mismatches_all(6, false), 0u);
        EXPECT_EQ(slurp(victim), "mine");
        xshard::mpi::barrier(w);
    }
}

TEST(checkpoint, either_form_replaces_the_other_and_stale_temporaries_do_not_matter) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const auto dir = scratch();
    const auto path = dir + "/ckpt";
    on_rank0([&] {
        fs::create_directories(path + ".tmp/inside"); // a stale temporary directory
        spit(path + ".tmp/inside/x", "x");
    });
    net n(m, saved_layouts);
    std::int64_t step = 0;
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank,
                              checkpoint_format::integrated, checkpoint_format::per_rank}) {
        ++step;
        n.fill_all(step);
        xshard::save_checkpoint(path, n, {.format = format, .step = step});
        net loaded(m, other_layouts);
        const auto info = xshard::load_checkpoint(path, loaded);
        EXPECT_EQ(info.step, step);
        EXPECT_EQ(info.format, format);
        EXPECT_EQ(loaded.mismatches_all(step, false), 0u) << "step " << step;
        EXPECT_FALSE(fs::exists(path + ".old")) << "step " << step;
    }
}

TEST(checkpoint, a_stale_old_directory_never_hides_the_checkpoint) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const auto path = scratch() + "/ckpt";
    net n(m, saved_layouts);
    n.fill_all(1);
    xshard::save_checkpoint(path + ".old", n, {.format = checkpoint_format::per_rank, .step = 1});
    n.fill_all(2);
    xshard::save_checkpoint(path, n, {.format = checkpoint_format::integrated, .step = 2});
    net loaded(m, other_layouts);
    EXPECT_EQ(xshard::load_checkpoint(path, loaded).step, 2);
    EXPECT_EQ(loaded.mismatches_all(2, false), 0u);
}

/// Sets the modification time of `path` (never through a link) `seconds` into the past.
void age(const std::string& path, long seconds) {
    const timespec t[2] = {{std::time(nullptr) - seconds, 0}, {std::time(nullptr) - seconds, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW), 0) << path;
}

TEST(checkpoint, a_save_removes_what_killed_saves_left_and_nothing_else) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    net n(m, saved_layouts);
    n.fill_all(3);
    const long old = 2 * long(xshard::detail::stale_after_seconds);
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto dir = scratch();
        const auto path = dir + "/ckpt", victim = dir + "/victim.txt";
        std::optional<xshard::detail::file> in_progress;
        on_rank0([&] {
            spit(victim, "mine");
            // What killed saves of both forms left: old, and held by nobody.
            spit(path + ".tmp-0123456789abcdef", "half a checkpoint");
            age(path + ".tmp-0123456789abcdef", old);
            fs::create_directories(path + ".tmp-Ab3xY9");
            spit(path + ".tmp-Ab3xY9/rank_0.safetensors", "half a rank file");
            age(path + ".tmp-Ab3xY9", old);
            // Not to be removed: a save in progress (held, files.hpp), a recent temporary,
            // a link at a temporary's name, a user's file and a directory with a user's file.
            in_progress.emplace(xshard::detail::create_temporary_file(path));
            age(in_progress->path(), old);
            spit(path + ".tmp-fedcba9876543210", "recent");
            fs::create_symlink(victim, path + ".tmp-00112233445566ff");
            age(path + ".tmp-00112233445566ff", old);
            spit(path + ".tmp-notes", "mine");
            age(path + ".tmp-notes", old);
            fs::create_directories(path + ".tmp-Zz0000");
            spit(path + ".tmp-Zz0000/notes.txt", "mine");
            age(path + ".tmp-Zz0000", old);
        });
        xshard::save_checkpoint(path, n, {.format = format, .step = 3});
        net loaded(m, other_layouts);
        EXPECT_EQ(xshard::load_checkpoint(path, loaded).step, 3);
        EXPECT_EQ(loaded.mismatches_all(3, false), 0u);
        xshard::mpi::barrier(w);
        const auto form = format == checkpoint_format::integrated ? "integrated" : "per-rank";
        std::set<std::string> kept{"ckpt",
                                   "ckpt.tmp-00112233445566ff",
                                   "ckpt.tmp-Zz0000",
                                   "ckpt.tmp-fedcba9876543210",
                                   "ckpt.tmp-notes",
                                   "victim.txt"};
        std::vector<std::string> others;
        for (const auto& e : fs::directory_iterator(dir)) {
            const auto name = e.path().filename().string();
            if (!kept.erase(name))
                others.push_back(name);
        }
        EXPECT_TRUE(kept.empty()) << form << ": removed " << (kept.empty() ? "" : *kept.begin());
        // The only other entry: the temporary of the save in progress.
        std::string listed;
        for (const auto& name : others)
            listed += " " + name;
        ASSERT_EQ(others.size(), 1u) << form << ": left:" << listed;
        EXPECT_TRUE(others[0].starts_with("ckpt.tmp-")) << form << ": " << others[0];
        if (w.rank() == 0) {
            EXPECT_EQ(others[0], fs::path(in_progress->path()).filename().string()) << form;
        }
        EXPECT_EQ(slurp(victim), "mine");
        EXPECT_EQ(slurp(path + ".tmp-Zz0000/notes.txt"), "mine");
        xshard::mpi::barrier(w);
    }
}

/// Loads with `r` in the saved layouts (one pass) and in others (two passes), expecting step
/// 1's values whole; `failure` says what a mismatch would mean.
void expect_loads_step_1(const ckpt_mesh& m, const xshard::checkpoint_reader& r,
                         const std::string& failure) {
    for (const bool same_layouts : {true, false}) {
        net loaded(m, same_layouts ? saved_layouts : other_layouts);
        loaded.fill_all(9);
        std::tuple<> no_state;
        auto model = xshard::detail::collect_model(loaded, no_state, false);
        const std::string passes = same_layouts ? " (one pass)" : " (two passes)";
        EXPECT_NO_THROW({ EXPECT_EQ(xshard::detail::load(model, r).step, 1); })
            << failure << passes;
        EXPECT_EQ(loaded.mismatches_all(1, false), 0u) << failure << passes;
    }
}

TEST(checkpoint, a_load_reads_the_bytes_it_verified_even_if_the_file_is_replaced) {
    // The reader opens the file (load_checkpoint's first step); then another file replaces
    // it by rename, as a save does, whose values are another step's and one of whose bytes
    // is damaged; then the load runs (load_checkpoint's second step). It must read through
    // the descriptor it opened and checked: it loads the first file's values, whole and
    // unchanged. (A load that opened the path again would load the other step's values or
    // raise a checksum mismatch.)
    const auto w = world();
    for (const auto& [dp, mp] : {std::pair(1, w.size()), std::pair(w.size(), 1)}) {
        const ckpt_mesh m(w, {dp, mp});
        const auto name = where(m);
        const auto dir = scratch();
        const auto path = dir + "/ckpt.safetensors";
        net n(m, saved_layouts);
        n.fill_all(1);
        xshard::save_checkpoint(path, n, {.step = 1});
        n.fill_all(2);
        xshard::save_checkpoint(dir + "/other.safetensors", n, {.step = 2});

        std::optional<xshard::checkpoint_reader> r;
        r.emplace(path);
        xshard::mpi::barrier(w);
        on_rank0([&] {
            auto bytes = slurp(dir + "/other.safetensors");
            const auto h = xshard::checkpoint_reader(dir + "/other.safetensors").header(0);
            const auto w1 = h.data_start + h.find("w1")->begin;
            bytes[w1 + 3] = char(bytes[w1 + 3] ^ 0x40);
            spit(dir + "/replacement", bytes);
            fs::rename(dir + "/replacement", path);
        });
        expect_loads_step_1(m, *r, name + ": the load read bytes it did not open first");
        xshard::mpi::barrier(w);
    }
}

TEST(checkpoint, a_per_rank_load_reads_the_directory_it_opened_even_if_another_replaces_it) {
    // The reader opens the directory (load_checkpoint's first step: strategy.json and
    // checkpoint.json); then another checkpoint's directory takes the path, as a save's renames
    // do (the first is moved aside); then the load runs. It must read the rank files of the
    // directory it opened: step 1's values, whole. (A load that opened the rank files by path
    // would pair step 1's strategy with step 2's values.) And if the directory it opened is
    // removed meanwhile, the load raises on every rank.
    const auto w = world();
    const auto per_rank = checkpoint_format::per_rank;
    for (const auto& [dp, mp] : {std::pair(1, w.size()), std::pair(w.size(), 1)}) {
        const ckpt_mesh m(w, {dp, mp});
        const auto name = where(m);
        const auto dir = scratch();
        const auto path = dir + "/ckpt";
        net n(m, saved_layouts);
        n.fill_all(1);
        xshard::save_checkpoint(path, n, {.format = per_rank, .step = 1});
        n.fill_all(2);
        xshard::save_checkpoint(dir + "/other", n, {.format = per_rank, .step = 2});

        std::optional<xshard::checkpoint_reader> r;
        r.emplace(path);
        xshard::mpi::barrier(w);
        on_rank0([&] {
            fs::rename(path, dir + "/aside");
            fs::rename(dir + "/other", path);
        });
        expect_loads_step_1(
            m, *r, name + ": the load read rank files of another directory than it opened");

        r.emplace(path); // step 2's directory, removed before its rank files are read
        xshard::mpi::barrier(w);
        on_rank0([&] { fs::remove_all(path); });
        net loaded(m, saved_layouts);
        std::tuple<> no_state;
        auto model = xshard::detail::collect_model(loaded, no_state, false);
        expect_io_error([&] { xshard::detail::load(model, *r); }, "rank_", name + ", removed");
        xshard::mpi::barrier(w);
    }
}

TEST(checkpoint, ranks_that_opened_different_files_raise_everywhere) {
    // What the load checks after opening: one file on every rank (its inode, size, time).
    const auto w = world();
    std::array<std::uint64_t, 4> id{7, 4096, 1, 2};
    EXPECT_NO_THROW(xshard::detail::check_same_file(w, id, "same"));
    if (w.rank() == w.size() - 1)
        id[0] = 8; // another inode
    if (w.size() > 1)
        expect_io_error([&] { xshard::detail::check_same_file(w, id, "p"); },
                        "p changed while it was being loaded", "another file on the last rank");
}

// --- large counts -----------------------------------------------------------------------

/// The bytes of `t` after MPI packing with `type` (one of it), from `source`.
std::vector<unsigned char> packed(const xshard::derived_datatype& type,
                                  const std::vector<unsigned char>& source) {
    int size = 0;
    MPI_Pack_size(1, type.native(), MPI_COMM_SELF, &size);
    if (size == 0)
        return {};
    std::vector<unsigned char> out(static_cast<std::size_t>(size), 0);
    int at = 0;
    MPI_Pack(source.data(), 1, type.native(), out.data(), size, &at, MPI_COMM_SELF);
    out.resize(std::size_t(at));
    return out;
}

TEST(subarray, split_counts_give_the_same_box_as_mpi_subarray) {
    // Counts above the limit are split into groups (and groups of groups); with a limit of 2
    // every count here splits.
    const std::vector<std::size_t> shape{5, 7, 3}, offset{1, 2, 0}, extent{3, 5, 3};
    std::vector<unsigned char> source(5 * 7 * 3 * 2);
    for (std::size_t i = 0; i < source.size(); ++i)
        source[i] = static_cast<unsigned char>(i);
    std::vector<unsigned char> want;
    for (std::size_t i = 0; i < extent[0]; ++i)
        for (std::size_t j = 0; j < extent[1]; ++j)
            for (std::size_t k = 0; k < extent[2]; ++k)
                for (std::size_t b = 0; b < 2; ++b)
                    want.push_back(source[(((offset[0] + i) * 7 + offset[1] + j) * 3 + k) * 2 + b]);
    const auto element = xshard::byte_run_datatype(2);
    for (const std::size_t limit : {std::size_t(2), std::size_t(3), std::size_t(1) << 30}) {
        const auto split =
            xshard::detail::box_from_vectors(shape, offset, extent, element.native(), limit);
        EXPECT_EQ(packed(split, source), want) << "limit " << limit;
        EXPECT_EQ(xshard::detail::extent_of(split.native()), source.size()) << "limit " << limit;
    }
    EXPECT_EQ(packed(xshard::byte_subarray_datatype(shape, offset, extent, 2), source), want);
    const std::vector<std::size_t> none{3, 0, 3};
    EXPECT_TRUE(packed(xshard::byte_subarray_datatype(shape, offset, none, 2), source).empty());
}

// Over 2 GiB in one rank's block (run alone: ctest label "large", one rank).
TEST(large, a_block_over_2_gib_saves_and_loads_in_both_forms) {
    const auto w = world();
    const ckpt_mesh m(w, {1, w.size()});
    const std::size_t cols = (std::size_t(1) << 31) / 3 + 2; // 3 rows: 2^31 + 4 bytes
    auto make = [&] {
        return xshard::zeros<std::uint8_t, xshard::dynamic_layout(2)>(m, {3, cols * w.size()},
                                                                      "[-, mp]");
    };
    auto value = [](std::size_t i) {
        return std::uint8_t((i * 7 + i / 4099) % 251);
    };
    auto saved = std::tuple(xshard::parameter{"big", make()});
    auto& block = std::get<0>(saved).value.local();
    for (std::size_t i = 0; i < block.size(); ++i)
        block.data()[i] = value(i);
    ASSERT_GT(block.size(), std::size_t(INT_MAX));
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank}) {
        const auto path = scratch() + "/large";
        xshard::save_checkpoint(path, saved, {.format = format, .step = 1});
        auto loaded = std::tuple(xshard::parameter{"big", make()});
        EXPECT_EQ(xshard::load_checkpoint(path, loaded).step, 1);
        const auto* p = std::get<0>(loaded).value.local().data();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < block.size(); ++i)
            bad += p[i] != value(i);
        EXPECT_EQ(bad, 0u) << (format == checkpoint_format::integrated ? "integrated" : "per-rank");
        on_rank0([&] { fs::remove_all(path); });
    }
}

// --- across worlds: saved on 2x2 by the io.save_2x2 fixture ------------------------------

const std::string saved_2x2 = XSHARD_TEST_DATA_DIR "/saved_2x2";

TEST(saved_on_2x2, save) {
    const auto w = world();
    ASSERT_EQ(w.size(), 4) << "the fixture runs on 4 ranks";
    const ckpt_mesh m(w, {2, 2});
    net n(m, saved_layouts);
    momentum state(m, "[dp, mp]", "[mp, -]");
    n.fill_all(3);
    state.fill_all(3);
    on_rank0([] {
        fs::remove_all(XSHARD_TEST_DATA_DIR); // this fixture runs first: start clean
        fs::create_directories(saved_2x2);
    });
    for (const auto format : {checkpoint_format::integrated, checkpoint_format::per_rank})
        xshard::save_checkpoint(
            saved_2x2 + (format == checkpoint_format::integrated ? "/model.safetensors" : "/model"),
            n, {.format = format, .all_parameters = true, .step = 3}, state);
}

TEST(saved_on_2x2, loads_on_this_world_in_other_layouts) {
    ASSERT_TRUE(fs::exists(saved_2x2 + "/model"))
        << "run through ctest: the io.save_2x2 fixture writes " << saved_2x2;
    const auto w = world();
    const ckpt_mesh m(w, {w.size() >= 4 ? 2 : 1, w.size() >= 4 ? w.size() / 2 : w.size()});
    for (const auto* form : {"/model.safetensors", "/model"}) {
        net n(m, other_layouts);
        momentum state(m, "[-, mp]", "[(mp, dp), -]");
        const auto info = xshard::load_checkpoint(saved_2x2 + form, n, state, true);
        EXPECT_EQ(info.step, 3) << form;
        EXPECT_EQ(info.strategy.mesh.to_string(), "dp=2, mp=2") << form;
        EXPECT_EQ(n.mismatches_all(3), 0u) << form << " " << where(m);
        EXPECT_EQ(state.mismatches_all(3), 0u) << form << " " << where(m);
    }
}

// Written by tests/io/safetensors_interop.py with numpy (the io.python fixture).
TEST(python, a_safetensors_file_written_by_numpy_loads) {
    const auto path = XSHARD_TEST_DATA_DIR "/from_python.safetensors";
    ASSERT_TRUE(fs::exists(path)) << "run through ctest: the io.python fixture writes " << path;
    for_each_world_mesh([&](const ckpt_mesh& m) {
        net n(m, other_layouts);
        const auto info = xshard::load_checkpoint(path, n, std::tuple<>(), true);
        EXPECT_EQ(info.step, 0);
        EXPECT_EQ(n.mismatches_all(0), 0u) << where(m);
    });
}

// What xshard-ckpt merge and reshard do (io/offline.hpp), done here on rank 0 from the
// io.save_2x2 checkpoints: the results load into every mesh.
TEST(offline, merged_and_resharded_checkpoints_load_here) {
    const std::string dir = scratch(), merged = dir + "/merged.safetensors",
                      resharded = dir + "/resharded";
    on_rank0([&] {
        EXPECT_NO_THROW({
            EXPECT_EQ(xshard::merge_checkpoint(XSHARD_TEST_DATA_DIR "/saved_2x2/model", merged),
                      8u);
            const auto target =
                xshard::load_strategy_file(XSHARD_TEST_SOURCE_DIR "/reshard_strategy.json");
            EXPECT_EQ(xshard::reshard_checkpoint(
                          XSHARD_TEST_DATA_DIR "/saved_2x2/model.safetensors", target, resharded),
                      8u);
        });
    });
    for_each_world_mesh([&](const ckpt_mesh& m) {
        for (const auto& path : {merged, resharded}) {
            net n(m, saved_layouts);
            momentum state(m, "[mp, dp]", "[-, -]");
            const auto info = xshard::load_checkpoint(path, n, state, true);
            EXPECT_EQ(info.step, 3) << path;
            EXPECT_EQ(n.mismatches_all(3), 0u) << path << " " << where(m);
            EXPECT_EQ(state.mismatches_all(3), 0u) << path << " " << where(m);
        }
    });
    const auto s = xshard::checkpoint_reader(resharded).strategy();
    EXPECT_EQ(s.mesh.to_string(), "dp=2, mp=4");
    EXPECT_EQ(s.find("e")->lay, xshard::layout("[-, dp, mp]"));
    EXPECT_EQ(xshard::checkpoint_reader(merged).format(), checkpoint_format::integrated);
}

} // namespace
