// A small strict JSON parser: recursive descent over the text, one function
// per production of RFC 8259. DTP reads back only what it wrote itself (a
// checkpoint's header), so it favours clear errors over speed.
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dtp/error.h"
#include "dtp/json.h"

namespace dtp {

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  JsonValue document() {
    JsonValue value = parse_value(0);
    skip_space();
    if (at_ < text_.size()) fail("the end of the text");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;  // nesting, so a hostile file cannot overflow the stack

  [[noreturn]] void fail(const char* expected) const {
    std::string message = "JSON: expected ";
    message += expected;
    message += " at byte " + std::to_string(at_) + ", found ";
    if (at_ < text_.size()) {
      message += '\'';
      message += text_[at_];
      message += '\'';
    } else {
      message += "the end";
    }
    throw Error(message);
  }
  void skip_space() {
    while (at_ < text_.size() && std::strchr(" \t\r\n", text_[at_]) && text_[at_] != '\0') ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) return ++at_, true;
    return false;
  }
  void expect(char c, const char* expected) {
    if (!take(c)) fail(expected);
  }
  bool take_word(const char* word) {
    const std::size_t n = std::strlen(word);
    if (text_.compare(at_, n, word) != 0) return false;
    at_ += n;
    return true;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("less nesting (at most 64 levels)");
    skip_space();
    JsonValue value;
    if (at_ >= text_.size()) fail("a value");
    const char c = text_[at_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      value.kind = JsonValue::Kind::string;
      value.text = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      value.kind = JsonValue::Kind::number;
      value.text = parse_number();
    } else if (take_word("true") || take_word("false")) {
      value.kind = JsonValue::Kind::boolean;
      value.boolean = c == 't';
    } else if (!take_word("null")) {
      fail("a value");
    }
    return value;
  }

  JsonValue parse_object(int depth) {
    JsonValue value;
    value.kind = JsonValue::Kind::object;
    expect('{', "'{'");
    if (take('}')) return value;
    do {
      skip_space();
      if (at_ >= text_.size() || text_[at_] != '"') fail("a member name in quotes");
      std::string key = parse_string();
      expect(':', "':' after a member name");
      value.members.emplace_back(std::move(key), parse_value(depth + 1));
    } while (take(','));
    expect('}', "',' or '}'");
    return value;
  }

  JsonValue parse_array(int depth) {
    JsonValue value;
    value.kind = JsonValue::Kind::array;
    expect('[', "'['");
    if (take(']')) return value;
    do value.items.push_back(parse_value(depth + 1));
    while (take(','));
    expect(']', "',' or ']'");
    return value;
  }

  std::string parse_string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("a closing '\"'");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) --at_, fail("an escaped control character");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("an escape");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          out += parse_code_point();
          break;
        default:
          --at_, fail("one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u");
      }
    }
  }

  // \uXXXX as UTF-8 (surrogate pairs joined).
  std::string parse_code_point() {
    auto hex4 = [this]() {
      if (at_ + 4 > text_.size()) fail("four hex digits");
      unsigned value = 0;
      for (int i = 0; i < 4; ++i) {
        const char h = text_[at_++];
        value <<= 4;
        if (h >= '0' && h <= '9')
          value |= static_cast<unsigned>(h - '0');
        else if (h >= 'a' && h <= 'f')
          value |= static_cast<unsigned>(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F')
          value |= static_cast<unsigned>(h - 'A' + 10);
        else
          --at_, fail("a hex digit");
      }
      return value;
    };
    unsigned code = hex4();
    if (code >= 0xD800 && code < 0xDC00) {
      if (!take_word("\\u")) fail("the second half of a surrogate pair");
      const unsigned low = hex4();
      if (low < 0xDC00 || low >= 0xE000) fail("a low surrogate");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    std::string out;
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
    return out;
  }

  std::string parse_number() {
    const std::size_t start = at_;
    auto digits = [this]() {
      const std::size_t from = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      return at_ > from;
    };
    if (text_[at_] == '-') ++at_;
    if (at_ < text_.size() && text_[at_] == '0') {
      ++at_;
    } else if (!digits()) {
      fail("a digit");
    }
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      if (!digits()) fail("a digit after '.'");
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (!digits()) fail("a digit in the exponent");
    }
    return text_.substr(start, at_ - start);
  }

  const std::string& text_;
  std::size_t at_ = 0;
};

const char* kind_name(JsonValue::Kind kind) {
  static const char* names[] = {"null",     "a boolean", "a number",
                                "a string", "an array",  "an object"};
  return names[static_cast<int>(kind)];
}

}  // namespace

JsonValue parse_json(const std::string& text) { return Parser(text).document(); }

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const auto& [name, value] : members)
    if (name == key) return &value;
  return nullptr;
}

const JsonValue& JsonValue::at(const std::string& key) const {
  DTP_CHECK(kind == Kind::object, "JSON: looked for member '", key, "' in ", kind_name(kind),
            ", not an object");
  const JsonValue* value = find(key);
  DTP_CHECK(value != nullptr, "JSON: the object has no member '", key, "'");
  return *value;
}

double JsonValue::as_number(const std::string& what) const {
  DTP_CHECK(kind == Kind::number, what, ": expected a number, got ", kind_name(kind));
  return std::strtod(text.c_str(), nullptr);
}

std::int64_t JsonValue::as_int(const std::string& what) const {
  DTP_CHECK(kind == Kind::number, what, ": expected an integer, got ", kind_name(kind));
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  DTP_CHECK(errno == 0 && end && *end == '\0', what,
            ": expected an integer that fits 64 bits, got ", text);
  return value;
}

const std::string& JsonValue::as_string(const std::string& what) const {
  DTP_CHECK(kind == Kind::string, what, ": expected a string, got ", kind_name(kind));
  return text;
}

std::string JsonValue::dump() const {
  switch (kind) {
    case Kind::null:
      return "null";
    case Kind::boolean:
      return boolean ? "true" : "false";
    case Kind::number:
      return text;
    case Kind::string:
      return json_string(text);
    case Kind::array: {
      std::string out = "[";
      for (const JsonValue& item : items) {
        if (out.size() > 1) out += ',';
        out += item.dump();
      }
      return out + "]";
    }
    case Kind::object: {
      std::string out = "{";
      for (const auto& [name, value] : members) {
        if (out.size() > 1) out += ',';
        out += json_string(name);
        out += ':';
        out += value.dump();
      }
      return out + "}";
    }
  }
  return "null";
}

}  // namespace dtp
