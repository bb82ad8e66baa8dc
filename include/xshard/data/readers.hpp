#pragma once
/// \file
/// Readers of the classic image-classification files, giving datasets of `example<T>` with
/// pixels scaled to [0, 1]:
///
///  * MNIST (IDX): an image file (magic 2051, then big-endian u32 count, rows, cols, and
///    count * rows * cols u8 pixels, row-major) and a label file (magic 2049, big-endian u32
///    count, count u8 labels). Features: rows * cols values, row-major.
///  * CIFAR-10 (binary version): records of 1 label byte (0..9) and 3072 pixel bytes, a
///    32x32 image per channel, red then green then blue. Features: 3072 values in that
///    (channel-major) order.
///
/// Every rank reads the whole file (each rank's loader picks its own samples from it), or,
/// for a pipeline (MindSpore's per-stage data loading), only the part its stage needs:
/// `read_mnist(c, images, labels, {.images = ..., .labels = ...})` reads the images on the
/// first stage, the labels on the last and nothing elsewhere, the sample count agreed over
/// `c` from the ranks that read. The files are not compressed (gunzip them first). Malformed files
/// raise xshard::error naming the file and what is wrong with it: wrong magic number, truncated or
/// over-long data, image and label counts that differ, CIFAR-10 labels out of range. The overloads
/// that take a communicator first raise on every rank of it when any rank's read fails, or when the
/// ranks read datasets of different sizes (each file is read per rank, so one rank can see
/// another file or a damaged copy).

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/data/dataset.hpp>

#include <xtensor/xtensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

namespace xshard::data {

namespace detail {

/// The bytes of `file`; throws xshard::error (naming `reader`) if it cannot be read.
XSHARD_DECL std::vector<unsigned char> read_bytes(const std::filesystem::path& file,
                                                  const char* reader);

/// The big-endian u32 at byte `at`.
inline std::uint32_t big_endian_u32(const std::vector<unsigned char>& b, std::size_t at) {
    return std::uint32_t(b[at]) << 24 | std::uint32_t(b[at + 1]) << 16 |
           std::uint32_t(b[at + 2]) << 8 | std::uint32_t(b[at + 3]);
}

/// An IDX file's header after checking its magic number and that it holds exactly the
/// data it announces: the dimensions (count first) and the offset of the data.
struct idx_header {
    std::vector<std::size_t> dims;
    std::size_t data_offset = 0;
};

XSHARD_DECL idx_header read_idx_header(const std::vector<unsigned char>& bytes,
                                       const std::filesystem::path& file, std::uint32_t magic,
                                       const char* what);

} // namespace detail

/// The MNIST examples of an IDX image file and an IDX label file (see the file comment):
/// features rows * cols pixels / 255, labels as stored. Throws xshard::error for an
/// unreadable file, a wrong magic number, a file shorter or longer than its header says,
/// and image and label files of different counts.
template <std::floating_point T = float>
std::vector<example<T>> read_mnist(const std::filesystem::path& images,
                                   const std::filesystem::path& labels) {
    const auto image_bytes = detail::read_bytes(images, "read_mnist");
    const auto label_bytes = detail::read_bytes(labels, "read_mnist");
    const auto ih = detail::read_idx_header(image_bytes, images, 2051, "images");
    const auto lh = detail::read_idx_header(label_bytes, labels, 2049, "labels");
    if (ih.dims[0] != lh.dims[0])
        throw error("xshard: read_mnist: " + images.string() + " has " +
                    std::to_string(ih.dims[0]) + " images but " + labels.string() + " has " +
                    std::to_string(lh.dims[0]) + " labels");
    const std::size_t pixels = ih.dims[1] * ih.dims[2];
    std::vector<example<T>> out(ih.dims[0]);
    for (std::size_t i = 0; i < out.size(); ++i) {
        auto& s = out[i];
        s.features = xt::xtensor<T, 1>::from_shape({pixels});
        const unsigned char* p = image_bytes.data() + ih.data_offset + i * pixels;
        for (std::size_t j = 0; j < pixels; ++j)
            s.features(j) = T(p[j]) / T(255);
        s.label = label_bytes[lh.data_offset + i];
    }
    return out;
}

/// The examples of an IDX image file alone: features as read_mnist's, labels 0.
template <std::floating_point T = float>
std::vector<example<T>> read_mnist_images(const std::filesystem::path& images) {
    const auto bytes = detail::read_bytes(images, "read_mnist");
    const auto h = detail::read_idx_header(bytes, images, 2051, "images");
    const std::size_t pixels = h.dims[1] * h.dims[2];
    std::vector<example<T>> out(h.dims[0]);
    for (std::size_t i = 0; i < out.size(); ++i) {
        out[i].features = xt::xtensor<T, 1>::from_shape({pixels});
        const unsigned char* p = bytes.data() + h.data_offset + i * pixels;
        for (std::size_t j = 0; j < pixels; ++j)
            out[i].features(j) = T(p[j]) / T(255);
    }
    return out;
}

/// The examples of an IDX label file alone: labels as stored, no features (width 0).
template <std::floating_point T = float>
std::vector<example<T>> read_mnist_labels(const std::filesystem::path& labels) {
    const auto bytes = detail::read_bytes(labels, "read_mnist");
    const auto h = detail::read_idx_header(bytes, labels, 2049, "labels");
    std::vector<example<T>> out(h.dims[0]);
    for (std::size_t i = 0; i < out.size(); ++i) {
        out[i].features = xt::xtensor<T, 1>::from_shape({0});
        out[i].label = bytes[h.data_offset + i];
    }
    return out;
}

/// Which files of a dataset a rank reads.
struct dataset_parts {
    bool images = true; ///< the samples' features (a pipeline's first stage)
    bool labels = true; ///< their labels (a pipeline's last stage)
};

/// Bytes of a CIFAR-10 record: the label and 3 x 32 x 32 pixels.
inline constexpr std::size_t cifar10_record_bytes = 1 + 3 * 32 * 32;

/// The CIFAR-10 examples of binary batch files, in file order (see the file comment):
/// features the 3072 pixels / 255 (channel-major), labels 0..9. Throws xshard::error for an
/// unreadable or empty file, a size that is not a whole number of records, and a label
/// above 9 (a CIFAR-100 file has two label bytes).
template <std::floating_point T = float>
std::vector<example<T>> read_cifar10(const std::vector<std::filesystem::path>& files) {
    std::vector<example<T>> out;
    constexpr std::size_t pixels = cifar10_record_bytes - 1;
    for (const auto& file : files) {
        const auto bytes = detail::read_bytes(file, "read_cifar10");
        const std::string name = "xshard: read_cifar10: " + file.string();
        if (bytes.empty())
            throw error(name + " is empty");
        if (bytes.size() % cifar10_record_bytes != 0)
            throw error(name + " is truncated: " + std::to_string(bytes.size()) +
                        " bytes are not a whole number of " + std::to_string(cifar10_record_bytes) +
                        "-byte records (" + std::to_string(bytes.size() / cifar10_record_bytes) +
                        " and " + std::to_string(bytes.size() % cifar10_record_bytes) + " bytes)");
        const std::size_t records = bytes.size() / cifar10_record_bytes;
        for (std::size_t r = 0; r < records; ++r) {
            const unsigned char* p = bytes.data() + r * cifar10_record_bytes;
            if (p[0] > 9)
                throw error(name + ": record " + std::to_string(r) + " has label " +
                            std::to_string(p[0]) + "; CIFAR-10 labels are 0..9");
            example<T> s{xt::xtensor<T, 1>::from_shape({pixels}), p[0]};
            for (std::size_t j = 0; j < pixels; ++j)
                s.features(j) = T(p[1 + j]) / T(255);
            out.push_back(std::move(s));
        }
    }
    return out;
}

/// `read_cifar10` of one file.
template <std::floating_point T = float>
std::vector<example<T>> read_cifar10(const std::filesystem::path& file) {
    return read_cifar10<T>(std::vector<std::filesystem::path>{file});
}

/// `read_cifar10` of a list of files: `read_cifar10({"data_batch_1.bin", ...})`.
template <std::floating_point T = float>
std::vector<example<T>> read_cifar10(std::initializer_list<std::filesystem::path> files) {
    return read_cifar10<T>(std::vector<std::filesystem::path>(files));
}

/// `read_mnist` on every rank of `c`, agreed: a rank whose read fails rethrows its error and
/// the others throw xshard::error naming it; ranks that read different numbers of samples
/// (or sizes of image) all throw. Collective: an all-reduce of one int, one of four integers.
template <std::floating_point T = float>
std::vector<example<T>> read_mnist(const communicator& c, const std::filesystem::path& images,
                                   const std::filesystem::path& labels) {
    auto out = agreed(c, [&] { return read_mnist<T>(images, labels); });
    detail::check_dataset_agrees(c, out.size(), out.empty() ? 0 : out.front().features.size(),
                                 "read_mnist");
    return out;
}

/// `read_mnist` of the parts this rank reads (a pipeline: `{.images = pipe.reads_inputs(),
/// .labels = pipe.reads_labels()}`): the images, the labels (read_mnist_images,
/// read_mnist_labels), both, or neither, which no other file reading replaces: a rank that
/// reads neither gets as many empty examples (no features, label 0) as the others read, so
/// that every rank's loader counts the same steps. The count is agreed over `c` (the whole
/// mesh) from the ranks that read: a read failing anywhere, image and label files of
/// different counts, or no rank reading raise xshard::error on every rank. Collective: an
/// all-reduce of one int, one of six integers.
template <std::floating_point T = float>
std::vector<example<T>> read_mnist(const communicator& c, const std::filesystem::path& images,
                                   const std::filesystem::path& labels, dataset_parts parts) {
    std::vector<example<T>> out;
    agreed(c, [&] {
        if (parts.images && parts.labels)
            out = read_mnist<T>(images, labels);
        else if (parts.images)
            out = read_mnist_images<T>(images);
        else if (parts.labels)
            out = read_mnist_labels<T>(labels);
    });
    const bool read = parts.images || parts.labels;
    const unsigned long long n = out.size();
    const auto r = value_ranges<3>(c, {read ? n : 0ULL, read ? n : ~0ULL, read ? 1ULL : 0ULL});
    if (r[2].most == 0)
        throw error("xshard: read_mnist: no rank reads " + images.string() + " or " +
                    labels.string());
    if (r[0].most != r[1].least)
        throw error("xshard: read_mnist: the ranks read " + std::to_string(r[1].least) + " to " +
                    std::to_string(r[0].most) + " samples from " + images.string() + " and " +
                    labels.string() + "; the image and label files must hold as many");
    if (!read)
        out.assign(std::size_t(r[0].most), example<T>{xt::xtensor<T, 1>::from_shape({0}), 0});
    return out;
}

/// `read_cifar10` on every rank of `c`, agreed as `read_mnist(c, ...)` is. Collective: an
/// all-reduce of one int, one of four integers.
template <std::floating_point T = float>
std::vector<example<T>> read_cifar10(const communicator& c,
                                     const std::vector<std::filesystem::path>& files) {
    auto out = agreed(c, [&] { return read_cifar10<T>(files); });
    detail::check_dataset_agrees(c, out.size(), out.empty() ? 0 : out.front().features.size(),
                                 "read_cifar10");
    return out;
}

/// `read_cifar10(c, files)` of one file.
template <std::floating_point T = float>
std::vector<example<T>> read_cifar10(const communicator& c, const std::filesystem::path& file) {
    return read_cifar10<T>(c, std::vector<std::filesystem::path>{file});
}

} // namespace xshard::data

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/data/readers.ipp>
#endif
