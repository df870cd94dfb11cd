// Images a user attaches, as the data URLs the server reads (PNG, JPEG, GIF, BMP).
//
// A small image in one of those formats is sent as its own bytes (the model sees exactly what
// `llmrun run --image` would). A larger one, or one in a format the server does not read (WebP, AVIF,
// HEIC, … whatever this browser decodes), is drawn at most SIDE pixels on its longer side and sent as a
// JPEG: projectors see images at 336–1024 pixels anyway, and requests are limited to 4 MB.

const SENT_AS_IS = new Set(["image/png", "image/jpeg", "image/gif", "image/bmp"]);
const MAX_AS_IS = 1024 * 1024; // bytes
export const SIDE = 1536;
const DATA_URL = /^data:image\/(png|jpeg|gif|bmp);base64,[A-Za-z0-9+/]+={0,2}$/;
export const MAX_DATA_URL = 6 * 1024 * 1024; // characters: what an imported conversation may carry per image

export const isImageDataUrl = (value) => typeof value === "string" && value.length <= MAX_DATA_URL && DATA_URL.test(value);

function readAsDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

// The data URL to send for `file`; throws an Error whose message says why not.
export async function prepare(file) {
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch {
    throw new Error(`${file.name || "the pasted image"} is not an image this browser can read`);
  }
  const { width, height } = bitmap;
  if (SENT_AS_IS.has(file.type) && file.size <= MAX_AS_IS && Math.max(width, height) <= SIDE) {
    bitmap.close();
    const url = await readAsDataUrl(file);
    return url.replace(/^data:image\/x-ms-bmp;/, "data:image/bmp;");
  }
  const scale = Math.min(1, SIDE / Math.max(width, height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round(width * scale));
  canvas.height = Math.max(1, Math.round(height * scale));
  const context = canvas.getContext("2d");
  context.fillStyle = "#fff"; // a transparent PNG or WebP becomes a JPEG on white, not on black
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/jpeg", 0.9));
  if (!blob) throw new Error(`${file.name || "the image"} could not be converted`);
  return readAsDataUrl(blob);
}

// A user message as the API takes it: its images first (where the model reads them), then its text.
export function content(message) {
  const images = Array.isArray(message.images) ? message.images : [];
  if (!images.length) return message.content;
  return [
    ...images.map((url) => ({ type: "image_url", image_url: { url } })),
    { type: "text", text: message.content },
  ];
}
