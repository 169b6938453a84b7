#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <utility>
#include <ostream>
#include <string>
#include <vector>

namespace cf {

// A list of dimensions (or strides). Small-vector storage: up to 8 entries live
// inline, so creating tensors and recording autograd nodes does not hit malloc
// for shapes; longer lists spill to the heap. The API is the subset of
// std::vector that shape code uses, and converts to and from std::vector.
class Shape {
 public:
  using value_type = int64_t;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using size_type = size_t;

  Shape() = default;
  explicit Shape(size_t n, int64_t value = 0) { assign(n, value); }
  Shape(std::initializer_list<int64_t> v) { assign_range(v.begin(), v.end()); }
  template <typename It, typename = decltype(*std::declval<It>())>
  Shape(It first, It last) { assign_range(first, last); }
  Shape(const std::vector<int64_t>& v) { assign_range(v.begin(), v.end()); }  // NOLINT: implicit
  Shape(const Shape& o) { assign_range(o.begin(), o.end()); }
  Shape(Shape&& o) noexcept { take(o); }
  Shape& operator=(const Shape& o) {
    if (this != &o) {
      size_ = 0;
      assign_range(o.begin(), o.end());
    }
    return *this;
  }
  Shape& operator=(Shape&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  ~Shape() { release(); }
  operator std::vector<int64_t>() const { return std::vector<int64_t>(begin(), end()); }  // NOLINT

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return data_; }
  const int64_t* data() const { return data_; }
  int64_t& operator[](size_t i) { return data_[i]; }
  const int64_t& operator[](size_t i) const { return data_[i]; }
  int64_t& back() { return data_[size_ - 1]; }
  const int64_t& back() const { return data_[size_ - 1]; }
  int64_t& front() { return data_[0]; }
  const int64_t& front() const { return data_[0]; }
  iterator begin() { return data_; }
  iterator end() { return data_ + size_; }
  const_iterator begin() const { return data_; }
  const_iterator end() const { return data_ + size_; }

  void reserve(size_t n) { grow(n); }
  void clear() { size_ = 0; }
  void resize(size_t n, int64_t value = 0) {
    grow(n);
    for (size_t i = size_; i < n; ++i) data_[i] = value;
    size_ = n;
  }
  void assign(size_t n, int64_t value) {
    size_ = 0;
    resize(n, value);
  }
  void push_back(int64_t v) {
    grow(size_ + 1);
    data_[size_++] = v;
  }
  void pop_back() { --size_; }
  iterator insert(const_iterator pos, int64_t v) { return insert(pos, &v, &v + 1); }
  iterator insert(const_iterator pos, std::initializer_list<int64_t> v) {
    return insert(pos, v.begin(), v.end());
  }
  template <typename It, typename = decltype(*std::declval<It>())>
  iterator insert(const_iterator pos, It first, It last) {
    size_t at = size_t(pos - data_), n = size_t(std::distance(first, last));
    Shape tail(data_ + at, data_ + size_);  // copy first: [first, last) may alias *this
    Shape mid(first, last);
    resize(at + n + tail.size());
    std::copy(mid.begin(), mid.end(), data_ + at);
    std::copy(tail.begin(), tail.end(), data_ + at + n);
    return data_ + at;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    size_t a = size_t(first - data_), b = size_t(last - data_);
    std::copy(data_ + b, data_ + size_, data_ + a);
    size_ -= b - a;
    return data_ + a;
  }

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
  friend bool operator==(const Shape& a, const std::vector<int64_t>& b) { return a == Shape(b); }
  friend bool operator==(const std::vector<int64_t>& a, const Shape& b) { return Shape(a) == b; }
  friend bool operator!=(const Shape& a, const std::vector<int64_t>& b) { return !(a == b); }
  friend bool operator!=(const std::vector<int64_t>& a, const Shape& b) { return !(a == b); }

 private:
  static constexpr size_t kInline = 8;
  template <typename It>
  void assign_range(It first, It last) {
    size_t n = size_t(std::distance(first, last));
    grow(n);
    std::copy(first, last, data_);
    size_ = n;
  }
  void grow(size_t n) {
    if (n <= cap_) return;
    size_t cap = std::max(n, cap_ * 2);
    int64_t* p = new int64_t[cap];
    std::copy(data_, data_ + size_, p);
    release();
    data_ = p;
    cap_ = cap;
  }
  void release() {
    if (data_ != inline_) delete[] data_;
    data_ = inline_;
    cap_ = kInline;
  }
  void take(Shape& o) {
    size_ = o.size_;
    if (o.data_ == o.inline_) {
      data_ = inline_;
      cap_ = kInline;
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    } else {
      data_ = o.data_;
      cap_ = o.cap_;
      o.data_ = o.inline_;
      o.cap_ = kInline;
    }
    o.size_ = 0;
  }

  int64_t inline_[kInline] = {};
  int64_t* data_ = inline_;
  size_t size_ = 0;
  size_t cap_ = kInline;
};

// Product of the dimensions. Only exact for shapes that passed checked_numel
// (every tensor's shape did: Tensor::empty and make_view check it).
int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& s);

// ---- overflow-checked size arithmetic ----
// Every int64 product or sum of sizes that comes from user input (shapes,
// strides, byte counts, file headers, command-line sizes) goes through these, so
// a huge size is a ShapeError naming the op and the operands instead of a
// wrapped value (a zero-byte allocation that is then written past, or a sum of 0).
// `what` names the quantity for the message: "[op] what overflows int64: a * b".
int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what = "size");
int64_t checked_add(int64_t a, int64_t b, const char* op, const char* what = "size");
// numel_of that throws ShapeError "[op] shape (...) has more elements than int64 can count".
int64_t checked_numel(const Shape& s, const char* op);
// Bytes of a tensor of this shape and element size; throws ShapeError when the
// count exceeds int64 (the largest object size a pointer difference can span).
int64_t checked_nbytes(const Shape& s, size_t elem_size, const char* op);
// "(2,3)"; a 0-d shape prints as "()".
std::string shape_str(const Shape& s);
// NumPy broadcasting of two shapes; throws ShapeError naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Whether `from` broadcasts to `to` without enlarging it (expand's rule: from has at most to's dims and
// each of its trailing sizes is to's or 1).
bool broadcasts_to(const Shape& from, const Shape& to);
// Map a possibly negative axis into [0, ndim); throws IndexError naming `op`.
int64_t normalize_axis(int64_t axis, int64_t ndim, const char* op);

struct ShapePrinter { const Shape& s; };
inline std::ostream& operator<<(std::ostream& os, ShapePrinter p) { return os << shape_str(p.s); }

}  // namespace cf
