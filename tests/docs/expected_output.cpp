// What the two programs of docs/getting_started.md print, worked out without xshard: the
// mesh, layout and block texts written out from the partition rule for the mesh each rank
// count makes, the sums from serial xtensor computations of the same tensors, and the
// training loop's losses from the same network trained serially (forward, backward and SGD
// written out by hand). Writes the text to the file named by its first argument, for the
// program (1 or 2) and the number of ranks (1, 2 or 4) its next arguments name.

#include <xtensor/xrandom.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

using matrix = xt::xtensor<double, 2>;

/// Block 0 of n split k ways (the partition rule: the first n % k blocks one larger).
std::size_t first_block(std::size_t n, std::size_t k) { return n / k + (n % k ? 1 : 0); }

matrix product(const matrix& a, const matrix& b) {
    matrix c = xt::zeros<double>({a.shape()[0], b.shape()[1]});
    for (std::size_t i = 0; i < a.shape()[0]; ++i)
        for (std::size_t k = 0; k < a.shape()[1]; ++k)
            for (std::size_t j = 0; j < b.shape()[1]; ++j)
                c(i, j) += a(i, k) * b(k, j);
    return c;
}

matrix transposed(const matrix& a) {
    matrix t = xt::zeros<double>({a.shape()[1], a.shape()[0]});
    for (std::size_t i = 0; i < a.shape()[0]; ++i)
        for (std::size_t j = 0; j < a.shape()[1]; ++j)
            t(j, i) = a(i, j);
    return t;
}

/// The first program: mesh (dp = ranks / mp, mp = 2 for even rank counts), layouts, rank 0's
/// blocks, sums.
void first_program(std::FILE* out, int ranks) {
    const int mp = ranks % 2 == 0 ? 2 : 1, dp = ranks / mp;
    std::fprintf(out, "mesh(dp=%d, mp=%d)\n", dp, mp);
    // The strategy (ranks, 1): the rows over the run of trailing axes of size > 1 whose sizes
    // multiply to `ranks`.
    const char* rows = ranks == 1 ? "[-, -]" : ranks == 2 ? "[mp, -]" : "[(dp,mp), -]";
    std::fprintf(out, "layouts [dp, mp] and %s\n", rows);
    std::fprintf(out, "rank 0 holds rows 0:%zu, columns 0:%zu\n", first_block(6, std::size_t(dp)),
                 first_block(4, std::size_t(mp)));
    std::mt19937 engine_a(42);
    const matrix a = xt::random::rand<double>({6, 4}, 0.0, 1.0, engine_a);
    std::fprintf(out, "sum(a) = %.6f\n", xt::sum(a)());
    std::fprintf(out, "[-, mp]: rank 0 holds 6 x %zu; [(dp,mp), -]: %zu x 4; same values: yes\n",
                 first_block(4, std::size_t(mp)), first_block(6, std::size_t(ranks)));
    std::mt19937 engine_w(7);
    const matrix w = xt::random::rand<double>({4, 3}, 0.0, 1.0, engine_w);
    std::fprintf(out, "y = a w: [dp, -], sum(y) = %.6f\n", xt::sum(product(a, w))());
}

/// A weight [in, out] as the layers draw it: uniform in +-1/sqrt(in), row-major, from seed.
matrix initial_weight(std::size_t in, std::size_t out, unsigned seed) {
    std::mt19937 engine(seed);
    std::uniform_real_distribution<double> dist(-1 / std::sqrt(double(in)), 1 / std::sqrt(double(in)));
    matrix w = xt::zeros<double>({in, out});
    for (auto& v : w)
        v = dist(engine);
    return w;
}

/// The second program: 4 -> 16 (relu) -> 3, mean cross-entropy, SGD at 0.5, batches of 16 in
/// order, 8 epochs of 4 steps; the mean loss of each epoch.
void second_program(std::FILE* out) {
    const std::size_t n = 64, batch = 16;
    matrix x = xt::zeros<double>({n, std::size_t(4)});
    std::vector<std::size_t> labels(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double t = 0.1 * double(i);
        x(i, 0) = std::sin(t);
        x(i, 1) = std::cos(t);
        x(i, 2) = std::sin(2 * t);
        x(i, 3) = 0.5;
        labels[i] = x(i, 0) > 0.5 ? 0 : x(i, 1) > 0 ? 1 : 2;
    }
    matrix w1 = initial_weight(4, 16, 1), w2 = initial_weight(16, 3, 2);
    xt::xtensor<double, 1> b1 = xt::zeros<double>({16}), b2 = xt::zeros<double>({3});
    const double lr = 0.5;
    for (int epoch = 0; epoch < 8; ++epoch) {
        double total = 0;
        for (std::size_t first = 0; first + batch <= n; first += batch) {
            matrix xb = xt::zeros<double>({batch, std::size_t(4)});
            for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t j = 0; j < 4; ++j)
                    xb(i, j) = x(first + i, j);
            matrix pre = product(xb, w1);
            for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t j = 0; j < 16; ++j)
                    pre(i, j) += b1(j);
            matrix h = pre;
            for (auto& v : h)
                v = v > 0 ? v : 0;
            matrix z = product(h, w2);
            for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t j = 0; j < 3; ++j)
                    z(i, j) += b2(j);
            double loss = 0;
            matrix dz = xt::zeros<double>({batch, std::size_t(3)});
            for (std::size_t i = 0; i < batch; ++i) {
                double top = z(i, 0);
                for (std::size_t j = 1; j < 3; ++j)
                    top = std::max(top, z(i, j));
                double sum = 0;
                for (std::size_t j = 0; j < 3; ++j)
                    sum += std::exp(z(i, j) - top);
                const std::size_t label = labels[first + i];
                loss += std::log(sum) + top - z(i, label);
                for (std::size_t j = 0; j < 3; ++j)
                    dz(i, j) = (std::exp(z(i, j) - top) / sum - (j == label ? 1 : 0)) / double(batch);
            }
            loss /= double(batch);
            // Backward: the output layer, relu, the hidden layer.
            const matrix dw2 = product(transposed(h), dz);
            matrix dh = product(dz, transposed(w2));
            for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t j = 0; j < 16; ++j)
                    if (!(pre(i, j) > 0))
                        dh(i, j) = 0;
            const matrix dw1 = product(transposed(xb), dh);
            for (std::size_t i = 0; i < batch; ++i) {
                for (std::size_t j = 0; j < 3; ++j)
                    b2(j) -= lr * dz(i, j);
                for (std::size_t j = 0; j < 16; ++j)
                    b1(j) -= lr * dh(i, j);
            }
            w1 -= lr * dw1;
            w2 -= lr * dw2;
            total += loss;
        }
        std::fprintf(out, "epoch %d: mean loss %.6f\n", epoch + 1, total / double(n / batch));
    }
}

} // namespace

int main(int argc, char** argv) {
    const std::string program = argc == 4 ? argv[2] : "", ranks = argc == 4 ? argv[3] : "";
    if ((program != "1" && program != "2") || (ranks != "1" && ranks != "2" && ranks != "4")) {
        std::fprintf(stderr, "usage: docs_expected_output FILE 1|2 1|2|4\n");
        return 2;
    }
    std::FILE* out = std::fopen(argv[1], "w");
    if (!out)
        return 1;
    if (program == "1")
        first_program(out, std::stoi(ranks));
    else
        second_program(out);
    return std::fclose(out) == 0 ? 0 : 1;
}
