#pragma once
// The generated MNIST-format data set the MNIST examples train on without --mnist (one
// definition for examples/auto_parallel and examples/pipeline_mnist).

#include <xshard/comm/error.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

/// Writes an MNIST-like data set in the IDX format (2048 training images, 512 test): each
/// image shows its class as a bright bar whose row and column depend on it, over noise.
inline void write_mnist_like(const std::filesystem::path& dir) {
    std::filesystem::create_directories(dir);
    std::mt19937 rng(2024);
    const auto be32 = [](std::ofstream& f, std::uint32_t v) {
        const unsigned char b[4] = {
            static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
            static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
        f.write(reinterpret_cast<const char*>(b), 4);
    };
    for (const auto& [prefix, count] :
         {std::pair<std::string, std::uint32_t>{"train", 2048}, {"t10k", 512}}) {
        std::ofstream images(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary),
            labels(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary);
        be32(images, 0x803);
        be32(images, count);
        be32(images, 28);
        be32(images, 28);
        be32(labels, 0x801);
        be32(labels, count);
        for (std::uint32_t i = 0; i < count; ++i) {
            const unsigned label = rng() % 10;
            std::vector<char> pixels(28 * 28);
            for (auto& p : pixels)
                p = char(rng() % 64);
            for (unsigned c = 4 + label; c < 14 + label; ++c)
                for (unsigned r : {2 + 2 * label, 3 + 2 * label})
                    pixels[r * 28 + c] = char(160 + rng() % 96);
            images.write(pixels.data(), std::streamsize(pixels.size()));
            labels.put(char(label));
        }
        if (!images || !labels)
            throw xshard::io_error("cannot write the MNIST-like data set in " + dir.string());
    }
}
