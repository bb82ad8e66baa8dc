// Spatial parallelism's halo step (xshard/redistribute/halo.hpp) against a hand-written
// MPI_Sendrecv halo exchange that builds the same extended band: NCHW float32 images, height
// split over the ranks, a 3x3 window (one halo row each side) on batch 8 x 64 channels of
// 256 x 256 (the spatial ResNet size) and a 7x7 window (three rows) on 32 x 32.
// Forward: the band (own rows copied, halo rows received); adjoint: the halo rows' gradients
// sent back and added onto their owners. Run on 2 ranks:
//
//   mpirun -n 2 build/benchmarks/bench_spatial [--reps N] [--filter name] [--quick]
//
// `bytes` is what one rank sends per exchange. The plan's printout goes to stderr.

#include "harness.hpp"

#include <xshard/core.hpp>
#include <xshard/tensor.hpp>

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace bench = xshard::bench;
using mesh_1d = xshard::mesh<"x">;

/// The hand-written exchange: rows [0, before) of the band come from the rank above, rows
/// [before + own, before + own + after) from the rank below; the rank's own rows are copied
/// plane by plane. One MPI_Sendrecv per direction with MPI_Type_vector over the N x C planes.
struct sendrecv_halo {
    std::size_t planes, own, width, before, after;
    int up, down;
    MPI_Comm comm;
    MPI_Datatype send_up = MPI_DATATYPE_NULL, send_down = MPI_DATATYPE_NULL;
    MPI_Datatype recv_top = MPI_DATATYPE_NULL, recv_bottom = MPI_DATATYPE_NULL;
    std::vector<float> scratch_top, scratch_bottom;

    sendrecv_halo(std::size_t n_planes, std::size_t own_rows, std::size_t w, std::size_t b,
                  std::size_t a, int rank, int size, MPI_Comm c)
        : planes(n_planes)
        , own(own_rows)
        , width(w)
        , before(b)
        , after(a)
        , up(rank > 0 ? rank - 1 : MPI_PROC_NULL)
        , down(rank + 1 < size ? rank + 1 : MPI_PROC_NULL)
        , comm(c) {
        const int band_rows = int(before + own + after);
        // What the neighbours need: the rank above needs my first `after_of_above` rows; with
        // equal bands and a symmetric window that is `before` rows (and `after` for below).
        auto vec = [&](std::size_t rows, int stride_rows) {
            MPI_Datatype t;
            MPI_Type_vector(int(planes), int(rows * width), stride_rows * int(width), MPI_FLOAT,
                            &t);
            MPI_Type_commit(&t);
            return t;
        };
        send_up = vec(before, int(own));  // my first rows, to the rank above (its bottom halo)
        send_down = vec(after, int(own)); // my last rows, to the rank below
        recv_top = vec(before, band_rows);
        recv_bottom = vec(after, band_rows);
        scratch_top.resize(planes * after * width);
        scratch_bottom.resize(planes * before * width);
    }
    ~sendrecv_halo() {
        for (auto* t : {&send_up, &send_down, &recv_top, &recv_bottom})
            MPI_Type_free(t);
    }

    void forward(const float* in, float* band) const {
        const std::size_t band_plane = (before + own + after) * width, own_plane = own * width;
        for (std::size_t p = 0; p < planes; ++p)
            std::memcpy(band + p * band_plane + before * width, in + p * own_plane,
                        own_plane * sizeof(float));
        // Down the ranks: my last rows to the rank below, my top halo from the rank above.
        MPI_Sendrecv(in + (own - after) * width, 1, send_down, down, 0, band, 1, recv_top, up, 0,
                     comm, MPI_STATUS_IGNORE);
        MPI_Sendrecv(in, 1, send_up, up, 1, band + (before + own) * width, 1, recv_bottom, down, 1,
                     comm, MPI_STATUS_IGNORE);
    }

    /// The halo rows' gradients back to their owners, added onto theirs.
    void adjoint(const float* band_grad, float* grad) {
        const std::size_t band_plane = (before + own + after) * width, own_plane = own * width;
        for (std::size_t p = 0; p < planes; ++p)
            std::memcpy(grad + p * own_plane, band_grad + p * band_plane + before * width,
                        own_plane * sizeof(float));
        // My top halo's gradient goes up; the rank below's top halo (my last rows) comes in.
        MPI_Sendrecv(band_grad, 1, recv_top, up, 2, scratch_top.data(), int(planes * after * width),
                     MPI_FLOAT, down, 2, comm, MPI_STATUS_IGNORE);
        MPI_Sendrecv(band_grad + (before + own) * width, 1, recv_bottom, down, 3,
                     scratch_bottom.data(), int(planes * before * width), MPI_FLOAT, up, 3, comm,
                     MPI_STATUS_IGNORE);
        const std::size_t a = after * width, b = before * width;
        if (down != MPI_PROC_NULL)
            for (std::size_t p = 0; p < planes; ++p)
                for (std::size_t i = 0; i < a; ++i)
                    grad[p * own_plane + own_plane - a + i] += scratch_top[p * a + i];
        if (up != MPI_PROC_NULL)
            for (std::size_t p = 0; p < planes; ++p)
                for (std::size_t i = 0; i < b; ++i)
                    grad[p * own_plane + i] += scratch_bottom[p * b + i];
    }
};

void run_case(const mesh_1d& m, const bench::options& o, const std::string& name, std::size_t n,
              std::size_t c, std::size_t hw, std::size_t kernel) {
    const std::array<std::size_t, 4> shape{n, c, hw, hw};
    auto x = xshard::rand<float, "[-, -, x, -]">(m, shape, 3);
    const std::size_t half = kernel / 2;
    const xshard::sliding_window w{kernel, 1, 1, half, half};
    xshard::halo_plan<float, 4> plan(m, shape, x.layout(), xshard::windowed_dims{{2, w}});
    if (m.rank() == 0)
        std::fprintf(stderr, "%s:\n%s", name.c_str(), plan.describe().c_str());
    const auto& band = plan.band();
    const std::size_t own = x.block().extent[2];
    const std::size_t before = plan.source_block().offset[2] - band.offset[2];
    const std::size_t after = band.extent[2] - own - before;
    // The hand-written version needs equal bands and ranks inside (a symmetric halo on the
    // middle ranks); with p = 2 the edge ranks use before or after only.
    sendrecv_halo hand(n * c, own, hw, m.rank() > 0 ? half : 0, m.rank() + 1 < m.size() ? half : 0,
                       m.rank(), m.size(), m.comm().native());
    if (hand.before != before || hand.after != after) {
        if (m.rank() == 0)
            std::fprintf(stderr, "%s: bands not equal, skipped\n", name.c_str());
        return;
    }
    std::vector<float> band_buf(band.size()), band_hand(band.size());
    std::vector<float> grad(x.local().size()), grad_hand(x.local().size());
    plan.forward(x.local().data(), band_buf.data());
    const std::size_t bytes = plan.bytes_sent();
    hand.forward(x.local().data(), band_hand.data());
    if (band_buf != band_hand)
        std::fprintf(stderr, "%s: rank %d: the bands differ\n", name.c_str(), m.rank());
    plan.adjoint(band_buf.data(), grad.data());
    hand.adjoint(band_buf.data(), grad_hand.data());
    if (grad != grad_hand)
        std::fprintf(stderr, "%s: rank %d: the adjoints differ\n", name.c_str(), m.rank());
    if (o.wants(name + "_forward"))
        bench::report(m.comm(), name + "_forward", bytes, "MPI_Sendrecv",
                      bench::compare(
                          m.comm(), o, [&] { plan.forward(x.local().data(), band_buf.data()); },
                          [&] { hand.forward(x.local().data(), band_hand.data()); }));
    if (o.wants(name + "_adjoint"))
        bench::report(m.comm(), name + "_adjoint", bytes, "MPI_Sendrecv",
                      bench::compare(
                          m.comm(), o, [&] { plan.adjoint(band_buf.data(), grad.data()); },
                          [&] { hand.adjoint(band_buf.data(), grad_hand.data()); }));
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const auto world = xshard::communicator::world();
    const mesh_1d m(world, {world.size()});
    if (o.quick) {
        run_case(m, o, "halo_k3_f32_n2_c4_16x16", 2, 4, 16, 3);
        return 0;
    }
    run_case(m, o, "halo_k3_f32_n8_c64_256x256", 8, 64, 256, 3);
    run_case(m, o, "halo_k7_f32_n8_c64_32x32", 8, 64, 32, 7);
}
