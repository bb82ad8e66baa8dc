// Redistribution against the best hand-written MPI for the same movement, against
// ScaLAPACK's pdgemr2d for 2-D block layouts (when built with ScaLAPACK), and against a
// plain memcpy of the bytes that must move, and against `concurrent_memcpy`: every rank
// copying its whole destination block at once (the physical limit on one node). Double
// precision; global tensors of 64 MiB and 512 MiB; run on 2 ranks:
//
//   mpirun -n 2 build/benchmarks/bench_redistribute [--reps N] [--filter name] [--quick]
//
// The shared-memory path of steps among ranks of one node is opt-in (reduce_tuning);
// `mpirun -x XSHARD_BENCH_SHARED_MEMORY=1 ...` measures the cases through it. The cases
// named `..._node_storage` keep their shards in node storage (node_shared mesh, a
// node_storage opened for the case) and always take the shared-memory path: peers' blocks
// are read in place, each byte copied once. With `-x XSHARD_BENCH_FIT_CROSSOVERS=1` the
// crossovers between the pairwise reductions and MPI's collectives are fitted on the ranks
// first (xshard::calibrate_reduce_tuning) and installed (xshard::use_reduce_crossovers) for
// every plan the cases make.

#include "harness.hpp"

#include <xshard/core.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/tensor.hpp>

#include <mpi.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef XSHARD_HAVE_SCALAPACK
#include "scalapack.hpp"
#endif

namespace {

namespace bench = xshard::bench;
using mesh_1d = xshard::mesh<"x">;
using xshard::block_extent;
using xshard::block_offset;

std::string size_name(std::size_t bytes) {
    return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "MiB"
                               : std::to_string(bytes >> 10) + "KiB";
}

/// The hand-written "alltoallv straight into the target": one MPI_Alltoallw moving
/// [rows split] <-> [columns split] of a row-major R x C matrix, with a vector datatype on
/// the strided side and plain counts on the contiguous side.
struct rows_cols_exchange {
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
    std::vector<MPI_Datatype> send_types, recv_types;
    std::vector<xshard::derived_datatype> owned;

    /// rows_to_cols: [x, -] -> [-, x]; otherwise [-, x] -> [x, -].
    rows_cols_exchange(int p, int me, std::size_t R, std::size_t C, bool rows_to_cols) {
        const auto P = std::size_t(p), r = std::size_t(me);
        for (std::size_t q = 0; q < P; ++q) {
            const auto my_rows = block_extent(R, P, r), q_rows = block_extent(R, P, q);
            const auto my_cols = block_extent(C, P, r), q_cols = block_extent(C, P, q);
            if (rows_to_cols) {
                // Send my rows x q's columns (strided in my row block), receive q's rows x my
                // columns (contiguous in my column block).
                add(send_counts, send_displs, send_types, strided(my_rows, q_cols, C),
                    block_offset(C, P, q) * 8);
                add(recv_counts, recv_displs, recv_types, plain(q_rows * my_cols),
                    block_offset(R, P, q) * my_cols * 8);
            } else {
                add(send_counts, send_displs, send_types, plain(q_rows * my_cols),
                    block_offset(R, P, q) * my_cols * 8);
                add(recv_counts, recv_displs, recv_types, strided(my_rows, q_cols, C),
                    block_offset(C, P, q) * 8);
            }
        }
    }

    std::pair<int, MPI_Datatype> plain(std::size_t n) { return {int(n), MPI_DOUBLE}; }
    std::pair<int, MPI_Datatype> strided(std::size_t rows, std::size_t cols, std::size_t stride) {
        if (rows == 0 || cols == 0)
            return {0, MPI_DOUBLE};
        MPI_Datatype t;
        MPI_Type_vector(int(rows), int(cols), int(stride), MPI_DOUBLE, &t);
        owned.emplace_back(t);
        return {1, owned.back().native()};
    }
    static void add(std::vector<int>& counts, std::vector<int>& displs,
                    std::vector<MPI_Datatype>& types, std::pair<int, MPI_Datatype> what,
                    std::size_t byte_offset) {
        counts.push_back(what.first);
        displs.push_back(int(byte_offset));
        types.push_back(what.second);
    }

    void run(const double* in, double* out, MPI_Comm comm) {
        MPI_Alltoallw(in, send_counts.data(), send_displs.data(), send_types.data(), out,
                      recv_counts.data(), recv_displs.data(), recv_types.data(), comm);
    }
};

/// The bytes this rank receives in a [rows] <-> [cols] exchange: a memcpy of as many bytes
/// is the bound of the all-to-all family.
std::size_t moved_bytes(int p, int me, std::size_t R, std::size_t C) {
    const auto P = std::size_t(p), r = std::size_t(me);
    return (R - block_extent(R, P, r)) * block_extent(C, P, r) * sizeof(double);
}

/// The plans' tuning: the shared-memory path from 1 MiB on when XSHARD_BENCH_SHARED_MEMORY=1
/// (mpirun -x gives every rank the same value), else the default.
xshard::reduce_tuning bench_tuning() {
    const char* v = std::getenv("XSHARD_BENCH_SHARED_MEMORY");
    xshard::reduce_tuning t;
    if (v && std::string(v) == "1")
        t.shared_memory_min_bytes = std::size_t(1) << 20;
    return t;
}

/// The tuning of the node-storage cases: the shared-memory path at every size.
xshard::reduce_tuning node_tuning() {
    xshard::reduce_tuning t;
    t.shared_memory_min_bytes = 0;
    t.shared_memory_all_reduce = true;
    return t;
}

template <xshard::layout From, xshard::layout To, class Mesh = mesh_1d>
struct case_tensors {
    xshard::dtensor<double, Mesh, From> src;
    xshard::redistribution<xshard::dtensor<double, Mesh, From>, To> plan;
    xshard::dtensor<double, Mesh, To> dst;

    case_tensors(const Mesh& m, std::array<std::size_t, From.rank()> shape,
                 const xshard::reduce_tuning& tuning = bench_tuning())
        : src(xshard::full<double, From>(m, shape, 1.0))
        , plan(src, To, {}, tuning)
        , dst(plan(src)) {}
    void run() { plan.execute_unchecked(src, dst); }
    const double* in() const { return src.local().data(); }
    double* out() { return dst.local().data(); }
};

void memcpy_case(const xshard::communicator& c, const bench::options& o, const std::string& name,
                 std::size_t global_bytes, std::size_t bytes, auto&& candidate) {
    std::vector<char> a(bytes, 1), b(bytes);
    bench::report(c, name, global_bytes, "memcpy",
                  bench::compare(c, o, candidate, [&] { std::memcpy(b.data(), a.data(), bytes); }));
}

/// The physical limit on one node: every rank copies its whole destination block (`bytes`
/// on this rank) at the same time, from memory it owns into memory it owns. A redistribution
/// moves at least that (each destination byte is written once) while the ranks share the
/// node's memory bandwidth alike.
/// Reports case `name`: `t` (a partial sum of `bytes / 8` doubles made whole) against
/// MPI_Allreduce of the same buffers.
void allreduce_case(const xshard::communicator& c, const bench::options& o, const std::string& name,
                    std::size_t bytes, auto& t) {
    const int count = int(bytes / 8);
    bench::report(
        c, name, bytes, "MPI_Allreduce",
        bench::compare(
            c, o, [&] { t.run(); },
            [&] { MPI_Allreduce(t.in(), t.out(), count, MPI_DOUBLE, MPI_SUM, c.native()); }));
}

/// Reports case `name`: `t` (a partial sum of `bytes / 8` doubles split over the ranks)
/// against MPI_Reduce_scatter_block of the same buffers.
void reduce_scatter_case(const xshard::communicator& c, const bench::options& o,
                         const std::string& name, std::size_t bytes, auto& t) {
    const int count = int(bytes / 8 / std::size_t(c.size()));
    bench::report(c, name, bytes, "MPI_Reduce_scatter_block",
                  bench::compare(
                      c, o, [&] { t.run(); },
                      [&] {
                          MPI_Reduce_scatter_block(t.in(), t.out(), count, MPI_DOUBLE, MPI_SUM,
                                                   c.native());
                      }));
}

void concurrent_memcpy_case(const xshard::communicator& c, const bench::options& o,
                            const std::string& name, std::size_t global_bytes, std::size_t bytes,
                            auto&& candidate) {
    std::vector<char> a(bytes, 1), b(bytes, 2);
    bench::report(c, name, global_bytes, "concurrent_memcpy",
                  bench::compare(c, o, candidate, [&] { std::memcpy(b.data(), a.data(), bytes); }));
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const auto world = xshard::communicator::world();
    const mesh_1d m(world, {world.size()});
    const MPI_Comm comm = m.comm().native();
    const int p = m.size(), me = m.rank();
    if (me == 0)
        std::fprintf(stderr, "bench_redistribute: %d ranks, OPENBLAS_CORETYPE=%s\n", p,
                     std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE")
                                                      : "(unset)");
    if (const char* v = std::getenv("XSHARD_BENCH_FIT_CROSSOVERS"); v && std::string(v) == "1") {
        const auto fit = xshard::calibrate_reduce_tuning(world);
        xshard::use_reduce_crossovers(fit.tuning);
        if (me == 0)
            std::fprintf(stderr, "fitted crossovers: all-reduce %zu, reduce-scatter %zu bytes\n",
                         fit.tuning.min_piece_bytes, fit.tuning.reduce_scatter_min_piece_bytes);
    }

    const std::vector<std::size_t> sizes = o.quick
                                               ? std::vector<std::size_t>{1 << 16}
                                               : std::vector<std::size_t>{64u << 20, 512u << 20};
    for (const std::size_t bytes : sizes) {
        const std::size_t n = std::size_t(1) << (std::bit_width(bytes / 8) / 2); // square side
        const std::size_t R = n, C = bytes / 8 / n;
        const std::array<std::size_t, 2> shape{R, C};
        const std::string suffix = "_" + size_name(bytes);

        if (o.wants("split_to_replicate" + suffix)) {
            case_tensors<"[x, -]", "[-, -]"> t(m, shape);
            const int count = int(t.src.local().size());
            bench::report(m.comm(), "split_to_replicate" + suffix, bytes, "MPI_Allgather",
                          bench::compare(
                              m.comm(), o, [&] { t.run(); },
                              [&] {
                                  MPI_Allgather(t.in(), count, MPI_DOUBLE, t.out(), count,
                                                MPI_DOUBLE, comm);
                              }));
        }
        if (o.wants("replicate_to_split" + suffix)) {
            case_tensors<"[-, -]", "[x, -]"> t(m, shape);
            const auto b = t.dst.block();
            bench::report(
                m.comm(), "replicate_to_split" + suffix, bytes, "memcpy_block",
                bench::compare(
                    m.comm(), o, [&] { t.run(); },
                    [&] { std::memcpy(t.out(), t.in() + b.offset[0] * C, b.size() * 8); }));
        }
        if (o.wants("split0_to_split1" + suffix)) {
            case_tensors<"[x, -]", "[-, x]"> t(m, shape);
            rows_cols_exchange hand(p, me, R, C, true);
            const auto name = "split0_to_split1" + suffix;
            bench::report(
                m.comm(), name, bytes, "alltoallv_direct",
                bench::compare(
                    m.comm(), o, [&] { t.run(); }, [&] { hand.run(t.in(), t.out(), comm); }));
            memcpy_case(m.comm(), o, name, bytes, moved_bytes(p, me, R, C), [&] { t.run(); });
            concurrent_memcpy_case(m.comm(), o, name, bytes, t.dst.local().size() * 8,
                                   [&] { t.run(); });
        }
        if (o.wants("uneven_general" + suffix)) {
            const std::array<std::size_t, 2> odd{R + 3, C - 5};
            case_tensors<"[x, -]", "[-, x]"> t(m, odd);
            rows_cols_exchange hand(p, me, odd[0], odd[1], true);
            bench::report(
                m.comm(), "uneven_general" + suffix, bytes, "alltoallv_direct",
                bench::compare(
                    m.comm(), o, [&] { t.run(); }, [&] { hand.run(t.in(), t.out(), comm); }));
            concurrent_memcpy_case(m.comm(), o, "uneven_general" + suffix, bytes,
                                   t.dst.local().size() * 8, [&] { t.run(); });
        }
        if (o.wants("partial_to_replicate" + suffix)) {
            case_tensors<"[-] partial(sum: x)", "[-]"> t(m, {bytes / 8});
            allreduce_case(m.comm(), o, "partial_to_replicate" + suffix, bytes, t);
        }
        if (o.wants("partial_to_split" + suffix)) {
            case_tensors<"[-] partial(sum: x)", "[x]"> t(m, {bytes / 8});
            reduce_scatter_case(m.comm(), o, "partial_to_split" + suffix, bytes, t);
        }
        if (o.wants("multi_axis_reorder" + suffix)) {
            // [(dp,mp), -] -> [-, (mp,dp)] on a dp x mp mesh (mp = 2 when the ranks allow).
            using mesh_2d = xshard::mesh<"dp", "mp">;
            const mesh_2d m2(world, {xshard::auto_size, p % 2 == 0 ? 2 : 1});
            auto src = xshard::full<double, "[(dp,mp), -]">(m2, shape, 1.0);
            auto plan = xshard::make_redistribution<"[-, (mp,dp)]">(src);
            auto dst = plan(src);
            // Rank r's row block in (dp,mp) order and column block in (mp,dp) order are
            // both block r when dp or mp is 1; the hand-written exchange is then rows->cols.
            rows_cols_exchange hand(p, me, R, C, true);
            bench::report(m.comm(), "multi_axis_reorder" + suffix, bytes, "alltoallv_direct",
                          bench::compare(
                              m.comm(), o, [&] { plan.execute_unchecked(src, dst); },
                              [&] { hand.run(src.local().data(), dst.local().data(), comm); }));
        }
    }

    // The reductions across message sizes: the point-to-point path must never lose to MPI.
    for (const std::size_t bytes :
         o.quick ? std::vector<std::size_t>{}
                 : std::vector<std::size_t>{64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20}) {
        if (o.wants("partial_to_replicate_" + size_name(bytes))) {
            case_tensors<"[-] partial(sum: x)", "[-]"> t(m, {bytes / 8});
            allreduce_case(m.comm(), o, "partial_to_replicate_" + size_name(bytes), bytes, t);
        }
        if (o.wants("partial_to_split_" + size_name(bytes))) {
            case_tensors<"[-] partial(sum: x)", "[x]"> t(m, {bytes / 8});
            reduce_scatter_case(m.comm(), o, "partial_to_split_" + size_name(bytes), bytes, t);
        }
    }

    // Shards in node storage (64 MiB tensors; the anchor below too): against every rank
    // copying its destination block at once, and against MPI's reductions.
    {
        using node_mesh = xshard::node_shared<mesh_1d>;
        const node_mesh nm(m);
        const std::size_t bytes = o.quick ? std::size_t(1) << 16 : std::size_t(64) << 20;
        const std::size_t n = std::size_t(1) << (std::bit_width(bytes / 8) / 2);
        const std::size_t R = n, C = bytes / 8 / n;
        const std::string suffix = "_" + size_name(bytes) + "_node_storage";
        const std::size_t slack = std::size_t(1) << 20;
        if (o.wants("split0_to_split1" + suffix)) {
            xshard::node_storage storage(world, 2 * bytes / std::size_t(p) + slack);
            case_tensors<"[x, -]", "[-, x]", node_mesh> t(nm, {R, C}, node_tuning());
            concurrent_memcpy_case(m.comm(), o, "split0_to_split1" + suffix, bytes,
                                   t.dst.local().size() * 8, [&] { t.run(); });
        }
        if (o.wants("uneven_general" + suffix)) {
            xshard::node_storage storage(world, 2 * bytes / std::size_t(p) + slack);
            case_tensors<"[x, -]", "[-, x]", node_mesh> t(nm, {R + 3, C - 5}, node_tuning());
            concurrent_memcpy_case(m.comm(), o, "uneven_general" + suffix, bytes,
                                   t.dst.local().size() * 8, [&] { t.run(); });
        }
        if (o.wants("partial_to_replicate" + suffix)) {
            xshard::node_storage storage(world, 2 * bytes + slack);
            case_tensors<"[-] partial(sum: x)", "[-]", node_mesh> t(nm, {bytes / 8}, node_tuning());
            allreduce_case(m.comm(), o, "partial_to_replicate" + suffix, bytes, t);
        }
        if (o.wants("partial_to_split" + suffix)) {
            xshard::node_storage storage(world, bytes + bytes / std::size_t(p) + slack);
            case_tensors<"[-] partial(sum: x)", "[x]", node_mesh> t(nm, {bytes / 8}, node_tuning());
            reduce_scatter_case(m.comm(), o, "partial_to_split" + suffix, bytes, t);
        }
        const std::size_t side = o.quick ? 256 : 8192;
        const std::string anchor_node = (o.quick ? std::string("colblock_to_rowblock_256")
                                                 : std::string("colblock_to_rowblock_8192")) +
                                        "_node_storage";
        if (o.wants(anchor_node)) {
            xshard::node_storage storage(world, 2 * side * side * 8 / std::size_t(p) + slack);
            case_tensors<"[-, x]", "[x, -]", node_mesh> t(nm, {side, side}, node_tuning());
            concurrent_memcpy_case(m.comm(), o, anchor_node, side * side * 8,
                                   t.dst.local().size() * 8, [&] { t.run(); });
        }
    }

    // The anchor: an 8192 x 8192 matrix from column blocks to row blocks.
    const std::size_t N = o.quick ? 256 : 8192;
    const std::string anchor = o.quick ? "colblock_to_rowblock_256" : "colblock_to_rowblock_8192";
    if (o.wants(anchor)) {
        case_tensors<"[-, x]", "[x, -]"> t(m, {N, N});
        rows_cols_exchange hand(p, me, N, N, false);
        const std::size_t bytes = N * N * 8;
        bench::report(m.comm(), anchor, bytes, "alltoallv_direct",
                      bench::compare(
                          m.comm(), o, [&] { t.run(); }, [&] { hand.run(t.in(), t.out(), comm); }));
        memcpy_case(m.comm(), o, anchor, bytes, moved_bytes(p, me, N, N), [&] { t.run(); });
        concurrent_memcpy_case(m.comm(), o, anchor, bytes, t.dst.local().size() * 8,
                               [&] { t.run(); });
#ifdef XSHARD_HAVE_SCALAPACK
        // The row-major matrix M seen by ScaLAPACK (column-major) is its transpose T: M's
        // column blocks are T's row blocks (a p x 1 grid), M's row blocks T's column blocks
        // (a 1 x p grid); the local arrays are the same memory.
        int ctx_rows = 0, ctx_cols = 0, info = 0;
        Cblacs_get(0, 0, &ctx_rows);
        Cblacs_gridinit(&ctx_rows, "R", p, 1);
        Cblacs_get(0, 0, &ctx_cols);
        Cblacs_gridinit(&ctx_cols, "R", 1, p);
        const int n = int(N), block = int(N) / p, zero = 0, one = 1;
        const int lld_a = block, lld_b = n;
        int desc_a[9], desc_b[9];
        descinit_(desc_a, &n, &n, &block, &n, &zero, &zero, &ctx_rows, &lld_a, &info);
        descinit_(desc_b, &n, &n, &n, &block, &zero, &zero, &ctx_cols, &lld_b, &info);
        bench::report(m.comm(), anchor, bytes, "pdgemr2d",
                      bench::compare(
                          m.comm(), o, [&] { t.run(); },
                          [&] {
                              pdgemr2d_(&n, &n, t.in(), &one, &one, desc_a, t.out(), &one, &one,
                                        desc_b, &ctx_rows);
                          }));
        Cblacs_gridexit(ctx_rows);
        Cblacs_gridexit(ctx_cols);
#endif
    }
    if (me == 0 && !o.quick)
        std::fprintf(
            stderr, "%s",
            xshard::make_redistribution<"[x, -]">(xshard::full<double, "[-, x]">(m, {N, N}, 0.0))
                .describe()
                .c_str());
    return 0;
}
