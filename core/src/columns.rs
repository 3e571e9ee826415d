//! Arrow-layout column builders (validity bitmap, int32 offsets, values): the buffers go to
//! Python as bytes and become Arrow arrays with `pa.Array.from_buffers`, without a Python
//! object per value.

#[derive(Default)]
pub struct Validity {
    pub bits: Vec<u8>,
    pub len: usize,
    pub nulls: usize,
}

impl Validity {
    pub fn clear(&mut self) {
        self.bits.clear();
        self.len = 0;
        self.nulls = 0;
    }

    #[inline]
    pub fn push(&mut self, valid: bool) {
        if self.len.is_multiple_of(8) {
            self.bits.push(0);
        }
        if valid {
            *self.bits.last_mut().unwrap() |= 1 << (self.len % 8);
        } else {
            self.nulls += 1;
        }
        self.len += 1;
    }
}

/// string / binary with int32 offsets.
pub struct VarCol {
    pub valid: Validity,
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
}

impl Default for VarCol {
    fn default() -> Self {
        VarCol { valid: Validity::default(), offsets: vec![0], data: Vec::new() }
    }
}

impl VarCol {
    /// Empty again, keeping the buffers' capacity (columns are reused from batch to batch).
    pub fn clear(&mut self) {
        self.valid.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.data.clear();
    }

    /// Appends a value; false when the column would pass the int32 offset range.
    #[inline]
    pub fn push(&mut self, v: Option<&[u8]>) -> bool {
        if let Some(b) = v {
            if self.data.len() + b.len() > i32::MAX as usize {
                return false;
            }
            self.data.extend_from_slice(b);
        }
        self.valid.push(v.is_some());
        self.offsets.push(self.data.len() as i32);
        true
    }
}

#[derive(Default)]
pub struct NumCol<T> {
    pub valid: Validity,
    pub values: Vec<T>,
}

impl<T: Default + Copy> NumCol<T> {
    pub fn clear(&mut self) {
        self.valid.clear();
        self.values.clear();
    }

    #[inline]
    pub fn push(&mut self, v: Option<T>) {
        self.valid.push(v.is_some());
        self.values.push(v.unwrap_or_default());
    }
}

/// list<string>
pub struct ListCol {
    pub valid: Validity,
    pub offsets: Vec<i32>,
    pub items: VarCol,
}

impl Default for ListCol {
    fn default() -> Self {
        ListCol { valid: Validity::default(), offsets: vec![0], items: VarCol::default() }
    }
}

impl ListCol {
    pub fn clear(&mut self) {
        self.valid.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.items.clear();
    }

    /// Appends a list of these items (bytes of UTF-8 text); false when they would pass the
    /// int32 offset range.
    pub fn push_items<'b>(&mut self, items: impl Iterator<Item = &'b [u8]>) -> bool {
        for b in items {
            if !self.items.push(Some(b)) {
                return false;
            }
        }
        self.valid.push(true);
        self.offsets.push(self.items.valid.len as i32);
        true
    }

    /// Appends a null list.
    pub fn push_null(&mut self) {
        self.valid.push(false);
        self.offsets.push(self.items.valid.len as i32);
    }
}

pub fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain numeric values, read as their native-endian bytes (Arrow's layout)
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
