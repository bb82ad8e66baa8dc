#pragma once
/// \file
/// A character-level text corpus for language modelling: every byte is a token
/// (vocabulary 256), and sample i is the window of seq_len + 1 tokens starting at byte
/// i * seq_len (windows overlap by one token, the target of one window's last input).

#include <xshard/comm/error.hpp>
#include <xshard/data/dataset.hpp>

#include <range/v3/range/concepts.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <xtensor/xtensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

namespace xshard::data {

namespace detail {

/// Window `i` of a text: bytes i * seq_len .. i * seq_len + seq_len as tokens.
struct text_window_fn {
    std::shared_ptr<const std::string> text;
    std::size_t seq_len = 0;

    token_window operator()(index_type i) const {
        token_window w = token_window::from_shape({seq_len + 1});
        const std::size_t start = std::size_t(i) * seq_len;
        for (std::size_t j = 0; j <= seq_len; ++j)
            w(j) = std::int64_t(static_cast<unsigned char>((*text)[start + j]));
        return w;
    }
};

} // namespace detail

/// The windows of seq_len + 1 byte tokens of a text, at stride seq_len: a sized
/// random-access range-v3 view of `token_window`s, made on access. Copies share the text.
class text_corpus : public ranges::view_base {
    using view_type = decltype(ranges::views::iota(index_type{}, index_type{}) |
                               ranges::views::transform(detail::text_window_fn{}));

public:
    /// Byte tokens: 0 .. 255.
    static constexpr std::size_t vocab_size = 256;

    /// An empty corpus (no windows).
    text_corpus() = default;

    /// The corpus of `text`. Throws xshard::error if seq_len is 0 or the text is shorter
    /// than one window (seq_len + 1 bytes).
    text_corpus(std::string text, std::size_t seq_len)
        : text_(std::make_shared<const std::string>(std::move(text)))
        , seq_len_(seq_len) {
        if (seq_len == 0)
            throw error("xshard: text_corpus: seq_len is 0");
        if (text_->size() < seq_len + 1)
            throw error(
                "xshard: text_corpus: the text has " + std::to_string(text_->size()) +
                " bytes, fewer than one window of seq_len + 1 = " + std::to_string(seq_len + 1));
        const auto n = detail::checked_index((text_->size() - 1) / seq_len, "text_corpus");
        view_ = ranges::views::iota(index_type{0}, n) |
                ranges::views::transform(detail::text_window_fn{text_, seq_len});
    }

    /// A path is not text: use `text_corpus::from_file`.
    template <class P>
    requires std::same_as<P, std::filesystem::path> text_corpus(const P&, std::size_t)
    = delete;

    /// The corpus of the bytes of `file` (every rank reads the whole file). Throws
    /// xshard::error if it cannot be read, and as the text constructor does.
    static text_corpus from_file(const std::filesystem::path& file, std::size_t seq_len) {
        std::ifstream in(file, std::ios::binary);
        if (!in)
            throw error("xshard: text_corpus: cannot open " + file.string());
        std::ostringstream bytes;
        bytes << in.rdbuf();
        if (in.bad())
            throw error("xshard: text_corpus: cannot read " + file.string());
        return text_corpus(std::move(bytes).str(), seq_len);
    }

    /// The number of tokens per input (a window holds seq_len + 1).
    std::size_t seq_len() const noexcept { return seq_len_; }
    /// The text.
    const std::string& text() const {
        static const std::string empty;
        return text_ ? *text_ : empty;
    }

    /// The number of windows: (bytes - 1) / seq_len.
    std::size_t size() const { return std::size_t(ranges::size(view_)); }
    auto begin() const { return ranges::begin(view_); }
    auto end() const { return ranges::end(view_); }
    /// Window `i`: bytes i * seq_len .. i * seq_len + seq_len.
    token_window operator[](std::size_t i) const { return begin()[std::ptrdiff_t(i)]; }

private:
    std::shared_ptr<const std::string> text_;
    std::size_t seq_len_ = 0;
    view_type view_;
};

} // namespace xshard::data
