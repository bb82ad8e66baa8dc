#pragma once
// Shared helpers of xshard's MPI tests.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/core/mesh.hpp>

#include <array>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard::testing {

inline communicator world() {
    return communicator::world();
}

/// Keeps ranks whose wait a peer's failure ends from printing their flight recorder (tests
/// that fail on purpose), restoring the watch settings at the end of the scope.
struct quiet_failures {
    watch_settings saved = current_watch_settings();
    quiet_failures() {
        auto s = saved;
        s.print_on_failure = false;
        set_watch_settings(s);
    }
    quiet_failures(const quiet_failures&) = delete;
    quiet_failures& operator=(const quiet_failures&) = delete;
    ~quiet_failures() { set_watch_settings(saved); }
};

/// A mesh of size `S` per axis, named x / (dp, mp) / (a, b, c) by its dimension.
template <std::size_t N>
struct test_mesh;
template <>
struct test_mesh<1> {
    using type = mesh<"x">;
};
template <>
struct test_mesh<2> {
    using type = mesh<"dp", "mp">;
};
template <>
struct test_mesh<3> {
    using type = mesh<"a", "b", "c">;
};

/// Calls `f(mesh)` for every test mesh shape (1, 2, 3, 4, 6, 8, 2x2, 2x3, 3x2, 2x4, 4x2,
/// 2x2x2) whose size divides the world size; when the mesh is smaller than the world, the world is
/// split into groups of the mesh's size and each group builds its own mesh.
template <class F>
void for_each_mesh(F&& f) {
    const auto w = world();
    auto run = [&]<std::size_t N>(const std::array<int, N>& sizes) {
        int p = 1;
        for (int s : sizes)
            p *= s;
        if (w.size() % p != 0)
            return;
        const auto group = p == w.size() ? w : w.split(w.rank() / p, w.rank());
        f(typename test_mesh<N>::type(group, sizes));
    };
    for (int n : {1, 2, 3, 4, 6, 8})
        run(std::array{n});
    run(std::array{2, 2});
    run(std::array{2, 3});
    run(std::array{3, 2});
    run(std::array{2, 4});
    run(std::array{4, 2});
    run(std::array{2, 2, 2});
}

/// Calls `f(mesh)` for the (dp, mp) meshes of the whole world: (W, 1), (1, W) and, for
/// W > 2, (2, W/2) when W is even and (3, W/3) when 3 divides W (W = 6: 2x3 and 3x2).
template <class F>
void for_each_world_mesh(F&& f) {
    const auto w = world();
    std::vector<std::array<int, 2>> shapes{{w.size(), 1}, {1, w.size()}};
    if (w.size() > 2 && w.size() % 2 == 0)
        shapes.push_back({2, w.size() / 2});
    if (w.size() > 3 && w.size() % 3 == 0)
        shapes.push_back({3, w.size() / 3});
    for (const auto& s : shapes)
        f(mesh<"dp", "mp">(w, s));
}

/// The (dp, mp) mesh of the whole world with mp = 2 when the world size is even and
/// mp = 1 otherwise (1 x 1, 1 x 2, 3 x 1, 2 x 2, 3 x 2, 4 x 2): tests that need a
/// two-axis mesh run at every world size.
inline mesh<"dp", "mp"> world_mesh_2d() {
    const auto w = world();
    const int mp = w.size() % 2 == 0 ? 2 : 1;
    return mesh<"dp", "mp">(w, {w.size() / mp, mp});
}

/// A fresh directory under `base` that every rank of `c` sees, made by rank 0.
inline std::string shared_directory(const communicator& c, const std::string& base) {
    std::string path;
    if (c.rank() == 0) {
        std::filesystem::create_directories(base);
        std::string pattern = base + "/scratch.XXXXXX";
        if (!::mkdtemp(pattern.data()))
            throw std::runtime_error("cannot create a directory under " + base);
        path = pattern;
    }
    unsigned long long n = path.size();
    bcast(c, std::span(&n, 1), 0);
    path.resize(std::size_t(n));
    bcast(c, std::span(path.data(), path.size()), 0);
    return path;
}

/// "on mesh(dp=2, mp=2), rank 3": context for failure messages.
template <class Mesh>
std::string where(const Mesh& m) {
    return "on mesh(" + m.shape().to_string() + "), rank " + std::to_string(m.rank());
}

} // namespace xshard::testing
