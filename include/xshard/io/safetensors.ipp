#pragma once
/// \file
/// The definitions of what io/safetensors.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/safetensors.hpp>

namespace xshard {

XSHARD_DECL std::size_t dtype_size(std::string_view name) {
    static const std::map<std::string_view, std::size_t> sizes{
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},  {"I16", 2},
        {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1}, {"C64", 8}};
    const auto it = sizes.find(name);
    return it == sizes.end() ? 0 : it->second;
}

XSHARD_DECL const tensor_entry* safetensors_header::find(std::string_view name) const {
    for (const auto& t : tensors)
        if (t.name == name)
            return &t;
    return nullptr;
}

namespace detail {

XSHARD_DECL nlohmann::json parse_json(std::string_view text) {
    const nlohmann::json::parser_callback_t bounded = [](int depth, nlohmann::json::parse_event_t,
                                                         nlohmann::json&) {
        if (std::size_t(depth) > max_json_depth)
            throw io_error("xshard: JSON nested deeper than " + std::to_string(max_json_depth) +
                           " levels");
        return true;
    };
    try {
        return nlohmann::json::parse(text, bounded);
    } catch (const nlohmann::json::exception& e) {
        throw io_error(std::string("xshard: not valid JSON: ") + e.what());
    }
}

XSHARD_DECL std::uint64_t json_count(const nlohmann::json& value, const std::string& what,
                                     std::uint64_t lo,
                                     std::uint64_t hi) {
    if (!value.is_number_integer() || (value.is_number_integer() && !value.is_number_unsigned() &&
                                       value.get<std::int64_t>() < 0))
        throw io_error("xshard: " + what + " is not a count (a non-negative integer): " +
                       value.dump());
    const auto n = value.get<std::uint64_t>();
    if (n < lo || n > hi)
        throw io_error("xshard: " + what + " is " + std::to_string(n) + ", outside [" +
                       std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return n;
}

XSHARD_DECL std::uint64_t json_integer(const nlohmann::json& j, const char* key, std::uint64_t lo,
                                       std::uint64_t hi) {
    if (!j.is_object() || !j.contains(key))
        throw io_error(std::string("xshard: no '") + key + "'");
    return json_count(j.at(key), std::string("'") + key + "'", lo, hi);
}

XSHARD_DECL std::int64_t parse_step(const std::string& text) {
    if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != text.npos)
        throw io_error("xshard: the step '" + text + "' is not a count");
    return std::stoll(text);
}

XSHARD_DECL std::map<std::string, std::string> parse_checksums(const std::string& text) {
    const auto j = parse_json(text);
    if (!j.is_object())
        throw io_error("xshard: the checksums are not a JSON object");
    std::map<std::string, std::string> out;
    for (const auto& [name, crc] : j.items()) {
        if (!crc.is_string() || crc.get<std::string>().size() != 8 ||
            crc.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
            throw io_error("xshard: the checksum of a tensor is not 8 hex digits: " + crc.dump());
        out[name] = crc.get<std::string>();
    }
    return out;
}

XSHARD_DECL std::string printable(std::string_view name) {
    std::string out;
    for (unsigned char c : name) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c < 0x20 || c == 0x7f) {
            char code[5];
            std::snprintf(code, sizeof code, "\\x%02x", c);
            out += code;
        } else {
            out += char(c);
        }
    }
    return out;
}

} // namespace detail

XSHARD_DECL safetensors_header parse_header(std::string_view head, std::size_t file_size) {
    if (head.size() < 8 || file_size < 8)
        throw io_error("xshard: not a safetensors file: shorter than its 8-byte header length");
    std::uint64_t length = 0;
    for (int i = 7; i >= 0; --i)
        length = length << 8 | std::uint8_t(head[std::size_t(i)]);
    if (length > max_header_bytes || length > file_size - 8)
        throw io_error("xshard: safetensors header length " + std::to_string(length) +
                       " does not fit the file (" + std::to_string(file_size) + " bytes)");
    if (head.size() < 8 + length)
        throw io_error("xshard: safetensors header truncated");
    safetensors_header h;
    h.data_start = 8 + std::size_t(length);
    const std::size_t data_bytes = file_size - h.data_start;
    nlohmann::json json;
    try {
        json = detail::parse_json(head.substr(8, std::size_t(length)));
    } catch (const io_error& e) {
        throw io_error(std::string("xshard: safetensors header: ") + (e.what() + 8));
    }
    if (!json.is_object())
        throw io_error("xshard: safetensors header is not a JSON object");
    for (const auto& [name, value] : json.items()) {
        if (name == "__metadata__") {
            if (!value.is_object())
                throw io_error("xshard: safetensors __metadata__ is not an object");
            if (!h.metadata.empty())
                throw io_error("xshard: safetensors __metadata__ appears twice");
            for (const auto& [key, text] : value.items()) {
                if (!text.is_string())
                    throw io_error("xshard: safetensors metadata '" + key + "' is not a string");
                h.metadata[key] = text.get<std::string>();
            }
            continue;
        }
        if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
            !value.contains("data_offsets") || !value["dtype"].is_string() ||
            !value["shape"].is_array() || !value["data_offsets"].is_array() ||
            value["data_offsets"].size() != 2)
            throw io_error("xshard: safetensors entry '" + detail::printable(name) +
                           "' lacks dtype, shape or data_offsets");
        if (h.tensors.size() == max_tensors)
            throw io_error("xshard: more than " + std::to_string(max_tensors) +
                           " tensors in a safetensors header");
        tensor_entry t;
        t.name = name;
        t.dtype = value["dtype"].get<std::string>();
        const std::size_t element = dtype_size(t.dtype);
        if (element == 0)
            throw io_error("xshard: tensor '" + detail::printable(name) + "' has unknown dtype '" +
                           detail::printable(t.dtype) + "'");
        std::size_t bytes = element;
        if (value["shape"].size() > max_stored_rank)
            throw io_error("xshard: tensor '" + detail::printable(name) + "' has " +
                           std::to_string(value["shape"].size()) + " dimensions");
        for (const auto& e : value["shape"]) {
            if (!e.is_number_unsigned())
                throw io_error("xshard: tensor '" + detail::printable(name) +
                               "' has a shape that is not a list of counts");
            const auto n = e.get<std::uint64_t>();
            if (n != 0 && bytes > data_bytes / n) // more bytes than the file could hold
                throw io_error("xshard: tensor '" + detail::printable(name) +
                               "' has a shape larger than the file");
            bytes *= std::size_t(n);
            t.shape.push_back(std::size_t(n));
        }
        for (const auto& o : value["data_offsets"])
            if (!o.is_number_unsigned())
                throw io_error("xshard: tensor '" + detail::printable(name) +
                               "' has data offsets that are not counts");
        t.begin = std::size_t(value["data_offsets"][0].get<std::uint64_t>());
        t.end = std::size_t(value["data_offsets"][1].get<std::uint64_t>());
        if (t.begin > t.end || t.end > data_bytes)
            throw io_error("xshard: tensor '" + detail::printable(name) +
                           "' has data offsets beyond the file");
        if (t.end - t.begin != bytes)
            throw io_error("xshard: tensor '" + detail::printable(name) + "' has " +
                           std::to_string(t.end - t.begin) + " bytes of data for a shape of " +
                           std::to_string(bytes));
        h.tensors.push_back(std::move(t));
    }
    std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
        return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    const tensor_entry* last =
        nullptr; // the last one holding bytes (empty tensors overlap nothing)
    for (const auto& t : h.tensors) {
        if (t.begin == t.end)
            continue;
        if (last && t.begin < last->end)
            throw io_error("xshard: tensors '" + detail::printable(last->name) + "' and '" +
                           detail::printable(t.name) + "' overlap in the file");
        last = &t;
    }
    return h;
}

XSHARD_DECL std::string make_header(std::vector<tensor_entry>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
    nlohmann::ordered_json json;
    if (!metadata.empty())
        json["__metadata__"] = metadata;
    std::size_t at = 0;
    for (auto& t : tensors) {
        t.begin = at;
        t.end = at + t.elements() * dtype_size(t.dtype);
        at = t.end;
        json[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
    }
    std::string text = json.dump();
    text.append((data_alignment - (8 + text.size()) % data_alignment) % data_alignment, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i)
        out[std::size_t(i)] = char((std::uint64_t(text.size()) >> (8 * i)) & 0xff);
    return out + text;
}

} // namespace xshard

